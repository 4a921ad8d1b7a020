"""Acceptance counters of speculative decoding (``LLM.get_stats()``)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecStats:
    num_rounds: int = 0  # verified sequence-rounds that carried at least one draft
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    #: per draft position j: drafts proposed at j, and how many of them were accepted
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    #: engine rounds without drafts because more sequences ran than ``disable_by_batch_size``
    num_disabled_rounds: int = 0

    def record(self, num_drafts: int, num_accepted: int) -> None:
        if not num_drafts:
            return
        self.num_rounds += 1
        self.num_draft_tokens += num_drafts
        self.num_accepted_tokens += num_accepted
        grow = num_drafts - len(self.drafted_per_position)
        if grow > 0:
            self.drafted_per_position.extend([0] * grow)
            self.accepted_per_position.extend([0] * grow)
        for j in range(num_drafts):
            self.drafted_per_position[j] += 1
            self.accepted_per_position[j] += j < num_accepted

    def as_dict(self) -> dict[str, object]:
        return {
            "spec_num_draft_tokens": self.num_draft_tokens,
            "spec_num_accepted_tokens": self.num_accepted_tokens,
            # tokens emitted per verified round: accepted drafts + the bonus / correction token
            "spec_mean_acceptance_length": (
                1 + self.num_accepted_tokens / self.num_rounds if self.num_rounds else 0.0
            ),
            "spec_acceptance_per_position": [
                a / d if d else 0.0 for a, d in zip(self.accepted_per_position, self.drafted_per_position)
            ],
            "spec_num_disabled_rounds": self.num_disabled_rounds,
        }
