"""When the PyTorch engine's decode loop stops: stop strings and stop regexes
(``SamplingParams.stop`` / ``.stop_regex``: which rows have stopped, and where each completion is
cut), and :class:`AllFinished`, the early stop once every row has.

SGLang does the same from the same settings (``stop``, ``stop_regex``, ``no_stop_trim``): the stop
text is kept in the completion.
"""

from __future__ import annotations

import re

import torch

from slime_gb10.grpo.interfaces import SamplingParams


def stops_in(text: str, params: SamplingParams) -> bool:
    """Whether ``text`` holds one of ``params``' stop strings or a match of a stop regex."""
    return any(s in text for s in params.stop) or any(re.search(p, text) for p in params.stop_regex)


def rows_stopped(tokenizer, tokens, finished, params: SamplingParams, stop_hit: list[bool]) -> torch.Tensor:
    """Rows whose text holds a stop string or a stop-regex match (checked on the host; only when
    stops are given); marks them in ``stop_hit``. ``tokens`` is the decode loop's list of ``[B]``
    token tensors. The last 64 tokens' text is searched; a row found there is confirmed on its whole
    text (a window can start inside a match, and an anchored pattern would match at the window's
    start). A match longer than 64 tokens is not found: bound such patterns."""
    window = torch.stack(tokens[-64:], dim=1).cpu().tolist()
    done = finished.cpu().tolist()
    rows = [row for row in range(len(window)) if not (done[row] or stop_hit[row])]
    tails = tokenizer.batch_decode([window[row] for row in rows], skip_special_tokens=True)
    candidates = [row for row, tail in zip(rows, tails) if stops_in(tail, params)]
    hit = [False] * len(window)
    if candidates:
        whole = torch.stack(tokens, dim=1)[candidates].cpu().tolist()
        texts = tokenizer.batch_decode(whole, skip_special_tokens=True)
        for row, text in zip(candidates, texts):
            if stops_in(text, params):
                hit[row] = stop_hit[row] = True
    return torch.tensor(hit, dtype=torch.bool, device=finished.device)


def cut_at_stop(tokenizer, completion: list[int], logprobs: list[float], params: SamplingParams):
    """``(ids, logprobs, text)`` of the shortest prefix whose text holds a stop string or regex
    match (the stop is kept), found by bisection (a prefix that holds a match keeps holding it as
    it grows); the whole completion where none does."""

    def decode(n: int) -> str:
        return tokenizer.decode(completion[:n], skip_special_tokens=True)

    if not stops_in(decode(len(completion)), params):
        return completion, logprobs, decode(len(completion))
    low, high = 1, len(completion)
    while low < high:
        mid = (low + high) // 2
        if stops_in(decode(mid), params):
            high = mid
        else:
            low = mid + 1
    return completion[:low], logprobs[:low], decode(low)


class AllFinished:
    """Whether every row has finished, for the decode loop's early stop, without stalling a GPU.

    On a GPU the answer reaches the host one check late: each check reads the flag the previous
    check sent (an event recorded 4 steps ago, long done) and sends the current one through pinned
    memory. Reading it at once made the host wait for the GPU to drain every 4 steps (128 times
    in a 512-token rollout) and then leave it idle while it queued the next step; the price is at
    most 4 more steps of padding once every row has finished (issue #27). On a CPU it reads at once.
    """

    def __init__(self, device: torch.device):
        self.gpu = device.type == "cuda"
        self.sent = False
        if self.gpu:
            self.host = torch.zeros((), dtype=torch.bool).pin_memory()
            self.event = torch.cuda.Event()

    def check(self, finished: torch.Tensor) -> bool:
        if not self.gpu:
            return bool(finished.all())
        done = False
        if self.sent:
            self.event.synchronize()
            done = bool(self.host)
        self.host.copy_(finished.all(), non_blocking=True)
        self.event.record()
        self.sent = True
        return done
