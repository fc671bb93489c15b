r"""The one state convention of every optimizer of the package: torch.optim's per-parameter state, and one
entry for what the whole step shares.

* ``optimizer.state[p]`` (p a parameter) holds p's part of every vector the optimizer keeps (its moments),
  as in ``torch.optim.Adam``: ``state[p]["exp_avg"]`` and the like. MoMo, MoMo-Adam and ConstantStepAdam
  keep them shaped like p; the hard-constrained optimizers, whose step works on one flat vector over all
  parameters (:class:`~lit_constrained.optim.flat.FlatLayout`), keep the flat vectors and give each
  parameter VIEWS of them (shaped like p's real view, in the step's working dtype): the same memory, so
  the step reads and writes the flat vectors directly and the per-parameter entries are never copied.
* ``optimizer.state[STATE_KEY]`` (``state["global"]``) holds what belongs to the whole step: the step
  count k, the loss model's scalars (MoMo), the safeguard's and the corrections' scalars, the working set
  and the last active set of the inequality rows. ConstantStepAdam has none (its step counts are per
  parameter, as torch's Adam).

``state_dict()`` / ``load_state_dict()`` carry all of it: nothing that changes a later step lives in an
attribute (the attributes hold the last step's ``diagnostics`` and scratch buffers, which a fresh optimizer
recomputes). Why views instead of the flat vectors in ``state["flat"]``: the per-parameter layout is what
torch.optim users, Lightning's checkpoint code (it moves ``state[p]`` to the parameter's device) and
tools that shard or inspect optimizer state per parameter expect, and the views keep the step as fast as
before: per step the class checks that each parameter's entries are still its views (an identity test per
parameter and vector, no copy); after ``load_state_dict`` or a device move (new tensors) the flat vectors
are gathered from the entries once (``torch.cat``) and the entries become views again.

Checkpoints of the earlier layouts load: the hard-constrained optimizers' single ``state["flat"]`` entry
(:func:`split_flat_state`), MoMo's ``state["momo"]`` (renamed).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import chain
from typing import Any

import torch
from torch import Tensor

from lit_constrained.jacobians.columns import real_view

STATE_KEY = "global"
"""The ``optimizer.state`` key of what the whole step shares (the step count and the scalars)."""
FLAT_LAYOUT_KEY = "flat"
"""The earlier layout's key: every vector and scalar of the hard-constrained optimizers in one entry."""
MOMO_LAYOUT_KEY = "momo"
"""The earlier layout's key of MoMo's scalars."""

ViewCache = dict[str, list[tuple[Tensor, list[Tensor]]]]
"""Per vector key, the flat vectors seen last (at most two: Adam(con) alternates two buffers) with their
per-parameter views."""


def parameter_views(flat: Tensor, params: Sequence[Tensor]) -> list[Tensor]:
    """Views of the flat vector ``flat``, one per parameter, shaped like its real view (layout order)."""
    views, offset = [], 0
    for p in params:
        shape = real_view(p).shape
        size = shape.numel()
        views.append(flat[offset:offset + size].view(shape))
        offset += size
    return views


def _views_of(cache: ViewCache, key: str, flat: Tensor, params: Sequence[Tensor]) -> list[Tensor]:
    """The per-parameter views of ``flat`` (made once per flat vector)."""
    seen = cache.setdefault(key, [])
    for base, views in seen:
        if base is flat:
            return views
    views = parameter_views(flat, params)
    seen.insert(0, (flat, views))
    del seen[2:]
    return views


def _cached_flat(cache: ViewCache, key: str, entries: Sequence[Any]) -> Tensor | None:
    """The flat vector whose views ``entries`` are (None when one of them is another tensor)."""
    for base, views in cache.get(key, ()):
        if len(views) == len(entries) and all(a is b for a, b in zip(entries, views)):
            return base
    return None


def gather_flat_state(state: dict[Any, Any], params: Sequence[Tensor], vector_keys: Iterable[str],
                      cache: ViewCache) -> dict[str, Any]:
    """The step's flat state from the optimizer's: the shared entry's items and, per vector key, the flat
    vector the parameters' entries are views of (gathered with ``torch.cat`` when they are not: after a
    load or a device move; the entries then become its views). Raises ``ValueError`` when a parameter has
    no entry (parameters were added since the first step)."""
    flat_state = dict(state[STATE_KEY])
    for key in vector_keys:
        entries = [state[p].get(key) if p in state else None for p in params]
        flat = _cached_flat(cache, key, entries)
        if flat is None:
            if any(entry is None for entry in entries):
                raise ValueError(
                    f"The number of parameters changed since the first step ({sum(e is None for e in entries)} "
                    f"of {len(entries)} have no state); create a new optimizer after adding parameter groups."
                )
            flat = torch.cat([real_view(entry).reshape(-1) for entry in entries])
            for p, view in zip(params, _views_of(cache, key, flat, params)):
                state[p][key] = view
        flat_state[key] = flat
    return flat_state


def scatter_flat_state(state: dict[Any, Any], params: Sequence[Tensor], flat_state: dict[str, Any],
                       vector_keys: Sequence[str], cache: ViewCache, previous: dict[str, Any] | None) -> None:
    """Write the step's new flat state into the optimizer's: the scalars into the shared entry, each flat
    vector as views into the parameters' entries (skipped where it is the vector ``previous`` gathered:
    the entries are its views already)."""
    keys = set(vector_keys)
    state[STATE_KEY] = {key: value for key, value in flat_state.items() if key not in keys}
    for key in vector_keys:
        flat = flat_state[key]
        if previous is not None and previous.get(key) is flat:
            continue
        for p, view in zip(params, _views_of(cache, key, flat, params)):
            state[p][key] = view


def _saved_ids(state_dict: dict[str, Any]) -> list[Any]:
    return list(chain.from_iterable(group["params"] for group in state_dict["param_groups"]))


def split_flat_state(state_dict: dict[str, Any], params: Sequence[Tensor], vector_keys: Sequence[str],
                     owner: str) -> dict[str, Any]:
    """A state dict of the earlier layout (everything in ``state["flat"]``) in today's: each vector split
    into the parameters' parts (layout order), the rest into ``state["global"]``. A state dict of today's
    layout is returned as it is; a flat vector of another length is refused (one line)."""
    saved = state_dict.get("state", {})
    if FLAT_LAYOUT_KEY not in saved:
        return state_dict
    flat_state = saved[FLAT_LAYOUT_KEY]
    ids = _saved_ids(state_dict)
    new_state: dict[Any, Any] = {key: value for key, value in saved.items() if key != FLAT_LAYOUT_KEY}
    new_state[STATE_KEY] = {key: value for key, value in flat_state.items() if key not in vector_keys}
    n = sum(real_view(p).numel() for p in params)
    for key in vector_keys:
        if key not in flat_state:
            continue
        flat = flat_state[key]
        if not isinstance(flat, Tensor) or flat.dim() != 1 or flat.numel() != n:
            raise ValueError(
                f"{owner}.load_state_dict: the checkpoint's state['flat'][{key!r}] has "
                f"{getattr(flat, 'numel', lambda: '?')()} entries, the {len(params)} parameters have n = {n} real "
                "entries: it was saved for other parameters; load it into an optimizer over the same parameters."
            )
        for saved_id, view in zip(ids, parameter_views(flat, params)):
            new_state.setdefault(saved_id, {})[key] = view
    return {**state_dict, "state": new_state}


def rename_momo_state(state_dict: dict[str, Any]) -> dict[str, Any]:
    """A state dict of MoMo's earlier layout (the scalars in ``state["momo"]``) in today's (``state["global"]``)."""
    saved = state_dict.get("state", {})
    if MOMO_LAYOUT_KEY not in saved:
        return state_dict
    renamed = {(STATE_KEY if key == MOMO_LAYOUT_KEY else key): value for key, value in saved.items()}
    return {**state_dict, "state": renamed}


def saved_parameter_entries(state_dict: dict[str, Any], params: Sequence[Tensor]) -> dict[Tensor, dict[str, Any]]:
    """The saved per-parameter entries by parameter, as saved (torch's ``load_state_dict`` casts floating
    state to each parameter's dtype: it would round a float64 moment of a float32 parameter, kept in float64
    by ``precision="float64"``)."""
    saved = state_dict.get("state", {})
    return {p: saved[i] for i, p in zip(_saved_ids(state_dict), params) if i in saved}


def restore_parameter_entries(state: dict[Any, Any], entries: dict[Tensor, dict[str, Any]]) -> None:
    """Put the saved entries back in place of torch's cast ones, each tensor on its parameter's device."""
    for p, entry in entries.items():
        state[p] = {key: value.to(device=p.device) if isinstance(value, Tensor) else value
                    for key, value in entry.items()}
