"""Beyond perplexity: the retrieval and agreement checks of a validation or a
sweep, run after the perplexity windows with the same model, codecs and peer,
and their readings put beside each scheme's verdict (which stays the
perplexity gate).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kvlib.checks.agreement import AgreementConfig, AgreementResult, prompt_starts, run_agreement
from kvlib.codec.spec import CodecConfig
from kvlib.scoring.provenance import RunIdentity
from kvlib.checks.retrieval import (RetrievalConfig, RetrievalResult, build_haystacks, lengths_within, model_context, run_retrieval)
from kvlib.scoring.store import ResultsStore
from kvlib.scoring.units import CheckUnits


@dataclass(frozen=True)
class DecodingChecks:
    """Which checks run, and their grids (None: not run)."""

    retrieval: RetrievalConfig | None = None
    agreement: AgreementConfig | None = None

    @classmethod
    def from_parameters(cls, retrieval: bool | None = None, retrieval_lengths: str | None = None,
                        retrieval_depths: str | None = None, retrieval_keys: int | None = None,
                        generation: bool | None = None, generation_prompts: int | None = None,
                        generation_context: int | None = None, generation_tokens: int | None = None,
                        ) -> "DecodingChecks":
        """From the CLI's flags or a notebook's parameters: a check runs when asked for (True), or,
        when not said (None), when one of its settings is given; False turns it off whatever its
        settings (``make sweep RETRIEVAL=False``). A setting left None keeps the module's default."""
        r = None
        settings = (retrieval_lengths, retrieval_depths, retrieval_keys)
        if retrieval or (retrieval is None and any(x is not None for x in settings)):
            r = RetrievalConfig.parse(retrieval_lengths, retrieval_depths, retrieval_keys)
        given = {k: v for k, v in (("prompts", generation_prompts), ("context_tokens", generation_context),
                                   ("new_tokens", generation_tokens)) if v is not None}
        a = AgreementConfig(**given) if generation or (generation is None and given) else None
        return cls(r, a)

    def check_inputs(self, model: Any, tokenizer: Any, num_tokens: int, corpus_name: str) -> None:
        """Build the haystacks (of the lengths the model's context holds, the
        ones that will run) and place the prompts now, so a grid that cannot
        fit fails before the slow part (ValueError naming the parameter)."""
        if self.retrieval is not None:
            build_haystacks(tokenizer, self.retrieval, lengths_within(self.retrieval, model_context(model)))
        if self.agreement is not None:
            prompt_starts(num_tokens, self.agreement, corpus_name)


def run_decoding_checks(lm: Any, tokenizer: Any, ids: torch.Tensor, codecs: list[CodecConfig], checks: DecodingChecks,
                        workdir: str | os.PathLike, model_name: str, corpus_name: str, peers: bool = False,
                        progress: bool = False, store: ResultsStore | None = None,
                        identity: RunIdentity | None = None) -> tuple[RetrievalResult | None, AgreementResult | None]:
    """Run the checks ``checks`` asks for; each prefills its own prompts once for every codec.
    With ``store`` and ``identity``, their units are read from the store and kept in it."""
    retrieval = agreement = None
    if checks.retrieval is not None:
        if progress:
            print("Pass-key retrieval...", flush=True)
        retrieval = run_retrieval(lm, tokenizer, codecs, Path(workdir) / "retrieval", checks.retrieval, model_name,
                                  peers, progress=progress, units=CheckUnits(store, identity, "retrieval"))
    if checks.agreement is not None:
        if progress:
            print("Generation agreement...", flush=True)
        agreement = run_agreement(lm, tokenizer, ids, codecs, Path(workdir) / "agreement", checks.agreement,
                                  model_name, corpus_name, peers, progress=progress,
                                  units=CheckUnits(store, identity, "agreement"))
    return retrieval, agreement


def readings(name: str, retrieval: RetrievalResult | None, agreement: AgreementResult | None) -> dict[str, Any]:
    """One scheme's numbers from both checks (NaN when a check did not run or the scheme was not in it)."""
    out: dict[str, Any] = {"retrieval_found": math.nan, "retrieval_total": math.nan, "retrieval_dropped": math.nan,
                           "generation_agreement": math.nan, "generation_divergence": math.nan}
    if retrieval is not None:
        try:
            s = retrieval.scheme(name)
            out.update(retrieval_found=s.found, retrieval_total=s.total, retrieval_dropped=s.dropped)
        except KeyError:
            pass
    if agreement is not None:
        try:
            a = agreement.scheme(name)
            out.update(generation_agreement=a.agreement, generation_divergence=a.mean_divergence)
        except KeyError:
            pass
    return out
