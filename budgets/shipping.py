"""What shipping an adapter costs off the card: the 16-bit merge, in host memory and on disk.

The merge is a full copy of the model in 16 bit, built in host memory and written to disk (chapter 6,
labs/grpo-ship): every parameter of the base, 2 bytes each, whatever the card held in 4 bit. Its GGUF
file and the copy MLflow logs are the same size again each.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from budgets.shapes import ModelShape, load_shape
from budgets.units import human_bytes

BYTES_16BIT = 2


@dataclass(frozen=True)
class MergeCost:
    model: str
    params: int
    merged_bytes: int  # one 16-bit copy: in host memory while it is built, then on disk
    copies_on_disk: int  # the merge folder, its GGUF file, the copy MLflow logs

    @property
    def disk_bytes(self) -> int:
        return self.merged_bytes * self.copies_on_disk

    def line(self) -> str:
        return (
            f"merged_16bit  {human_bytes(self.merged_bytes)} of host memory and "
            f"{human_bytes(self.disk_bytes)} of disk  = {self.params:,} parameters x {BYTES_16BIT} bytes "
            f"({self.copies_on_disk} copies on disk: the merge, its GGUF file, MLflow's model) [{self.model}]"
        )


def merge_cost(model: str | Path | ModelShape, copies_on_disk: int = 3) -> MergeCost:
    shape = load_shape(model)
    params = shape.total_params()
    return MergeCost(shape.name, params, params * BYTES_16BIT, copies_on_disk)
