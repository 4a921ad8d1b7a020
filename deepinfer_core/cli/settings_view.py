"""``deepinfer plugins --config``: the effective engine settings and every platform's section, with sources."""

from __future__ import annotations

from typing import Any

from deepinfer_core.config import ENV_PREFIX, SECTION_DELIMITER, EngineConfig, setting_sources


def settings_report(config: EngineConfig, config_file: str | None) -> dict[str, Any]:
    """``{"engine": {field: {value, source}}, "platforms": {name: {field: {value, source, description}}}}`` for
    a config bound to the installed platforms; a source is ``default``, ``config file`` or a variable's name."""
    sources = setting_sources(config_file)
    values = config.model_dump(mode="json", exclude={"sections"})
    engine = {k: {"value": v, "source": sources.get(k, "default")} for k, v in values.items()}
    platforms = {}
    for name, section in sorted(config.sections.items()):
        fields = type(section).model_fields
        platforms[name] = {
            key: {
                "value": value,
                "source": sources.get(f"{name}.{key}", "default"),
                "description": fields[key].description or "",
            }
            for key, value in section.model_dump(mode="json").items()
        }
    return {"engine": engine, "platforms": platforms}


def print_settings(report: dict[str, Any]) -> None:
    print("\nsettings (each: default < config file < DEEPINFER_* variable < argument)")
    print("  engine (DEEPINFER_<FIELD>, top level of a config file, LLM(field=...)):")
    for key, item in report["engine"].items():
        print(f"    {key} = {item['value']!r}  [{item['source']}]")
    for name, fields in report["platforms"].items():
        env = f"{ENV_PREFIX}{name.upper()}{SECTION_DELIMITER}<FIELD>"
        print(f"  {name} ({env}, [{name}] in a config file, LLM({name}={{...}})):")
        for key, item in fields.items():
            print(f"    {key} = {item['value']!r}  [{item['source']}]  {item['description']}")
