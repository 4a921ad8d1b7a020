"""DeepSeek-V4.1's image input: preprocessing (:mod:`.image_processor`), the vision tower (:mod:`.tower`) and
its settings (:mod:`.config`). ``docs/vision.md`` describes both and where the rules come from."""

from deepinfer_core.models.deepseek_v41.vision.config import VisionConfig
from deepinfer_core.models.deepseek_v41.vision.image_processor import (
    ImageInputError,
    ProcessedImage,
    process_image,
)
from deepinfer_core.models.deepseek_v41.vision.tower import VisionTower

__all__ = ["ImageInputError", "ProcessedImage", "VisionConfig", "VisionTower", "process_image"]
