"""Document boundaries inside packed training windows (block-causal masking, as torchtitan's
default).

A window of the token stream holds pieces of several documents, each ended by the tokenizer's EOS
id; the loader gives each window's document ids (``data/windows.py``: from the source's document
starts, or for streamed data, ``data/streams.py``, from the EOS it puts after each document). With
document masking a position attends only to earlier positions of its own document
(``models/common/attention_backends.py``); the loss targets do not change.
"""

from __future__ import annotations

import torch


def document_ids_from_eos(tokens: torch.Tensor, eos_id: int) -> torch.Tensor:
    """The document of each position, counted from the window start: int32 ``(bs, seqlen)`` for int
    ``tokens`` ``(bs, seqlen)``. An EOS belongs to the document it ends; the token after it starts
    the next one.

    Example: tokens ``[a, b, EOS, c, EOS, d]`` -> ``[0, 0, 0, 1, 1, 2]``.
    """
    is_eos = (tokens == eos_id).to(torch.int32)
    return (torch.cumsum(is_eos, dim=1, dtype=torch.int32) - is_eos).contiguous()


def document_positions(document_ids: torch.Tensor) -> torch.Tensor:
    """RoPE positions restarting at 0 at each document start: int64 ``(bs, seqlen)`` for
    ``document_ids`` ``(bs, seqlen)`` (non-decreasing along a row). Example: ``[0, 0, 0, 1, 1, 2]``
    -> ``[0, 1, 2, 0, 1, 0]``."""
    seqlen = document_ids.shape[1]
    pos = torch.arange(seqlen, device=document_ids.device).expand(document_ids.shape)
    starts = torch.ones_like(document_ids, dtype=torch.bool)
    starts[:, 1:] = document_ids[:, 1:] != document_ids[:, :-1]
    return pos - torch.cummax(torch.where(starts, pos, 0), dim=1).values


def document_inputs(document_ids: torch.Tensor | None, positions: str) -> dict[str, torch.Tensor]:
    """The model forward's document keyword arguments for a batch's int32 ``document_ids``
    ``(bs, seqlen)`` (the loader's, ``data/windows.py``): nothing when ``None`` (document masking
    off), else ``document_ids`` and, with ``positions = "restart"``, RoPE ``positions``
    (:func:`document_positions`); ``"continue"`` keeps ``0 .. seqlen-1``.
    """
    if document_ids is None:
        return {}
    if positions == "continue":
        return {"document_ids": document_ids}
    return {"document_ids": document_ids, "positions": document_positions(document_ids)}
