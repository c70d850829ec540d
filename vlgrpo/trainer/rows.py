"""The rows a run trains on: the sample stream's draws, each row checked the first time it is drawn, with the prompt
cache and the bookkeeping of the rows skipped (when the file was read and when drawn).

`CheckedRows.draw` replaces a bad row by the next one, so a batch stays full; `counts` gives `data/skipped_rows` and
`data/overlong_rows`; `state_dict` / `load_state_dict` go with the data position in each checkpoint, so a resumed run
keeps its skipped rows skipped and counted. The checks are the data layer's (`data.rowcheck`); the prompt length is
counted on the prompt the model gets (`build_prompt`, with the processor), which is why this lives in the trainer.
"""

from __future__ import annotations

import sys

from vlgrpo.config import DataConfig
from vlgrpo.data.adapters import no_usable_row, skip_reason
from vlgrpo.data.images import ProcessorGeometry, inspect_image
from vlgrpo.data.rowcheck import OVERLONG, Problem, RowVisuals, row_problems, visual_parts
from vlgrpo.data.schema import DataError
from vlgrpo.data.stream import SampleStream
from vlgrpo.data.video import inspect_video
from vlgrpo.policy.prompt import PromptInputs, PromptSettings, build_prompt
from vlgrpo.rollout.tools.table import tool_schemas
from vlgrpo.trainer.ranks import rank_world, sum_over_ranks
from vlgrpo.types import InputError, Sample


class CheckedRows:
    """Usable samples drawn from `data`, their prompts (built once per row), and the rows skipped: `skipped`,
    the DataErrors of the rows skipped when `source` was read (schema, JSON, not UTF-8, a preset's skips), and those
    found unusable when drawn."""

    def __init__(
        self,
        data: SampleStream,
        processor,
        geometry: ProcessorGeometry,
        cfg: DataConfig,
        prompt: PromptSettings,
        skipped: list[DataError],
        source: str,
    ) -> None:
        self.data, self.processor, self.geometry, self.cfg = data, processor, geometry, cfg
        self.settings = prompt
        """The run's prompt settings, the value its engine writes prompts from too (`PromptSettings.from_config`)."""
        self.skipped = skipped
        self.source = source
        """The training file, as messages name it."""
        self.tools = tool_schemas(prompt.tools) if prompt.tools else []
        """The tools' schemas the prompt carries (rollout.tools): counted in its length, as the model gets it."""
        self._prompts: dict[tuple[str, int | None], PromptInputs] = {}
        self._bad: dict[int, tuple[str, int | None]] = {}
        """{id(sample): (check, row)} of the rows found unusable when drawn (keyed by object: two rows may share an
        id)."""
        self._good: set[int] = set()

    def prompt(self, sample: Sample) -> PromptInputs:
        """Prompt token ids of a sample (built once per row: its id and its row in the file, which a copy from the
        split worker keeps; two rows may share an id, which `vlgrpo data doctor` reports)."""
        key = (sample.id, sample.row)
        if key not in self._prompts:
            self._prompts[key] = build_prompt(
                sample, self.processor, self.geometry, **self.settings.prompt_kw(), tools=self.tools
            )
        return self._prompts[key]

    def draw(self, k: int) -> list[Sample]:
        """The next k usable samples. A row is checked the first time it is drawn (`_problem`); a bad one is reported
        once, counted in data/skipped_rows and replaced by the next row, so the batch stays full."""
        out: list[Sample] = []
        while len(out) < k:
            (sample,) = self.data.next(1)
            key = id(sample)
            if key in self._bad:
                continue
            if key not in self._good:
                problem = self._problem(sample)
                if problem is not None:
                    self._bad[key] = (problem[0], sample.row)
                    where = self.source + (f", row {sample.row}" if sample.row is not None else "")
                    _warn(
                        f"{where} (id {sample.id!r}) skipped ({problem[0]}): {problem[1]}; counted in data/skipped_rows"
                    )
                    if len(self._bad) == len(self.data.samples):
                        raise self._no_usable_row()
                    continue
                self._good.add(key)
            out.append(sample)
        return out

    def _problem(self, sample: Sample) -> Problem | None:
        """Why a sample cannot be trained on: its images and video (decoded in full, once), reserved tokens in its
        text, its image_size or boxes against their image (`data.rowcheck`), then its prompt's length, counted
        exactly: every image's and the video's tokens plus the tokenised text. None when it can; a missing
        image_size (box rewards convert with it) is then set from the image the boxes lie in."""
        video = self.settings.video_sampling
        visuals = RowVisuals(
            [inspect_image(im) for im in sample.images],
            inspect_video(sample.video, video) if sample.video is not None else None,
        )
        problems = row_problems(sample, visuals, self.geometry)
        if problems:
            return problems[0]
        if sample.image_size is None and visuals.images:
            sample.image_size = visuals.images[sample.box_images[0] if sample.box_images else 0].decoded
        n, limit = len(self.prompt(sample).input_ids), self.cfg.max_prompt_length
        if n > limit:
            return OVERLONG, (
                f"its prompt has {n} tokens ({visual_parts(sample)} + text), more than "
                f"data.max_prompt_length={limit}; a row is never cut inside an image or a video: raise "
                "it, or lower model.max_pixels / data.video.max_pixels / max_frames"
            )
        return None

    @property
    def skipped_rows(self) -> int:
        """Rows this rank skipped so far, when the file was read and when drawn."""
        return len(self.skipped) + len(self._bad)

    @property
    def overlong_rows(self) -> int:
        """Rows skipped because their prompt is longer than data.max_prompt_length (`data/overlong_rows`)."""
        return sum(check == OVERLONG for check, _ in self._bad.values())

    def counts(self) -> dict[str, float]:
        """`data/skipped_rows` and `data/overlong_rows` of the whole run: the rows skipped when the file was read
        (every rank read the same file: counted once) plus every rank's rows skipped when drawn (one all-reduce)."""
        drawn = sum_over_ranks([len(self._bad), self.overlong_rows])
        return {"data/skipped_rows": float(len(self.skipped) + drawn[0]), "data/overlong_rows": float(drawn[1])}

    def state_dict(self) -> dict:
        """The rows this rank found unusable, by their place in its share (saved with its data position, so a resumed
        run neither counts them again nor loses them from data/skipped_rows)."""
        where = {id(x): i for i, x in enumerate(self.data.samples)}
        return {"bad": [[where[k], check, row] for k, (check, row) in self._bad.items() if k in where]}

    def load_state_dict(self, state: dict) -> None:
        samples = self.data.samples
        self._bad = {id(samples[i]): (check, row) for i, check, row in state.get("bad", []) if 0 <= i < len(samples)}

    def _no_usable_row(self) -> InputError:
        rank, world = rank_world()
        skipped = [(skip_reason(e), e.row) for e in self.skipped] + list(self._bad.values())
        scope = f" in rank {rank}'s share (one row in {world})" if world > 1 else ""
        return no_usable_row(self.source, skipped, scope)


def _warn(message: str) -> None:
    print(f"[vlgrpo] warning: {message}", file=sys.stderr)
