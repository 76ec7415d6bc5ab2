"""The portable rollout engine: batched sampling with a KV cache on PyTorch + ``transformers``.

Not ``model.generate``: a small decode loop over the HF model that (1) left-pads the prompts of a
batch (sorted by length, so similar lengths share a batch), (2) runs the prefill keeping only the
last position's logits (on the static path once per distinct prompt of the batch), (3) samples
each next token by inverting its row's CDF at a uniform drawn from the row's own key (an exact
categorical sample with no CPU sync, the same whatever else shares the batch) and records its
logprob under ``softmax(logits / T)`` on the fly, so no ``[steps, batch, vocab]`` score tensors are
kept, and (4) stops as soon as every row has finished.

For the common decoder-only architectures (Llama, Qwen2, Qwen3, Mistral without sliding window)
there is a second path, :class:`~slime_gb10.grpo.engines.torch.static_decoder.StaticDecoder`: the same modules (norms, projections, MLPs,
rotary embedding) driven by a small forward of ours over a preallocated KV cache with static
shapes, so that one decode step can be captured as a CUDA graph and replayed (kernel-launch
overhead dominates decoding of small models: ~30 layers x ~30 kernels per token), compiled by
``torch.compile`` first where that pays. A step attends over the cache slots written so far, rounded
up to a bucket (:func:`attention_length`; a graph per bucket), on a GPU through the grouped-query
kernel of :mod:`~slime_gb10.grpo.engines.torch.decode_attention`. Prefill and sampling
(:mod:`~slime_gb10.grpo.engines.torch.sampling`, one Triton kernel on a GPU) run outside the graphs.
Other architectures use the HF forward with a dynamic cache.

The engine holds its own copy of the weights (BF16 on a GPU), refreshed from the trainer through
``update_weights`` (a :mod:`slime_gb10.grpo.weight_sync` stream), exactly like SGLang would be.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import torch

from slime_gb10.grpo.engines.torch import step_kernel, stops
from slime_gb10.grpo.engines.torch.detokenize import decode_texts
from slime_gb10.grpo.engines.torch.sampling import row_uniforms, sample_next_token
from slime_gb10.grpo.engines.torch.static_decoder import (
    StaticDecoder,
    fuse_projections,
    supports_static_decoding,
)
from slime_gb10.grpo.interfaces import Generation, RolloutEngine, SamplingParams

log = logging.getLogger(__name__)


#: Largest relative error ``|replay - eager| / |eager|`` (L2 over the logits) accepted from a captured
#: decode step. A replay is bitwise equal only when every kernel picks the same algorithm; under
#: capture cuBLAS and SDPA may choose others (another workspace, split-K), so in BF16 a correct graph
#: differs from eager by rounding that grows through the layers. On SmolLM2-135M-Instruct single
#: logits moved by up to 0.625, which the old max-abs test (0.1% of the largest logit) rejected,
#: turning graphs off on real models; measured on an H100 (BENCHMARKS.md, issue #27): replay vs
#: eager 0.0038 relative error, while BF16 eager itself is 0.23 away from FP32, argmax agreement 1.0. A capture bug (a host value baked into the
#: graph, a stale buffer) moves the logits by O(1) relative error, far above these limits.
GRAPH_REPLAY_TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 2e-2}


def graph_replay_error(replayed: torch.Tensor, eager: torch.Tensor) -> float:
    """``||replayed - eager||_2 / ||eager||_2`` over all logits, in FP32 (inf if shapes differ)."""
    if replayed.shape != eager.shape:
        return float("inf")
    replayed, eager = replayed.float(), eager.float()
    return float(
        torch.linalg.vector_norm(replayed - eager) / torch.linalg.vector_norm(eager).clamp_min(1e-30)
    )


#: Decode attention reads the cache in buckets of this many slots (a CUDA graph per bucket).
ATTENTION_BUCKET = 64


def attention_length(slot: int, cache_len: int) -> int:
    """Cache slots a decode step writing ``slot`` attends over: ``slot + 1`` rounded up to a bucket.

    Attending over the whole static buffer read ~2x the KV the sequences had (shape B on an H100:
    SDPA was 31% of a decode step; issue #27). Buckets bound the distinct shapes -- one compiled
    step with the length as a dynamic dimension, one captured graph per bucket -- while a step
    reads at most ``ATTENTION_BUCKET - 1`` slots it does not need."""
    return min(cache_len, -(-(slot + 1) // ATTENTION_BUCKET) * ATTENTION_BUCKET)


def compile_decode_step(decoder: StaticDecoder, backend: str | Callable = "inductor") -> None:
    """``decoder.step`` = its forward through ``torch.compile``: static shapes but the attention span,
    which :meth:`_GraphedStep.run` marks dynamic, so every bucket of a (batch, cache) runs one
    compiled graph (shape B's first rollout, its one compile included, takes ~29 s on an H100;
    a compile per bucket would repeat most of that for each of its ~9 buckets)."""
    decoder.step = torch.compile(decoder.forward, backend=backend, fullgraph=True, dynamic=False)


class _GraphedStep:
    """The decode steps of a :class:`StaticDecoder` captured as CUDA graphs, one per attention
    length, sharing their static inputs and one memory pool (they never run concurrently)."""

    def __init__(self, decoder: StaticDecoder):
        self.decoder = decoder
        device = decoder.keys[0].device
        batch = decoder.batch
        self.input_ids = torch.zeros((batch, 1), dtype=torch.long, device=device)
        self.position_ids = torch.zeros((batch, 1), dtype=torch.long, device=device)
        self.cache_position = torch.zeros((1,), dtype=torch.long, device=device)
        # one column more than the cache: no bucket's slice is the whole (contiguous) row, which
        # would give the compiled step other strides to guard on and a second compile
        self.mask = torch.zeros((batch, 1, 1, decoder.cache_len + 1), dtype=torch.bool, device=device)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool = None

    def run(self, length: int) -> torch.Tensor:
        """The step eagerly (or through ``decoder.step``'s compiled code) over ``length`` slots."""
        mask = self.mask[..., :length]
        torch._dynamo.maybe_mark_dynamic(mask, 3)  # compiled: one graph for every bucket
        return self.decoder.step(self.input_ids, self.position_ids, self.cache_position, mask)

    def capture(self, length: int) -> None:
        """Warm up on a side stream, then capture on it (inputs must already hold a valid step).
        The same stream for both: the W4A16 Triton kernel's split-K tile counters are kept per
        stream and made on first use, which must not happen inside a capture."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self.run(length)
        torch.cuda.current_stream().wait_stream(stream)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, stream=stream):
            logits = self.run(length)
        self.graphs[length] = (graph, logits)

    def replay(self, length: int) -> torch.Tensor:
        graph, logits = self.graphs[length]
        graph.replay()
        return logits


class TorchRolloutEngine(RolloutEngine):
    def __init__(
        self,
        model,
        tokenizer,
        device: torch.device | str,
        *,
        eos_token_ids: Sequence[int],
        generation_batch_size: int | None = None,
        decode: str = "auto",
        compile_decode: bool | None = None,
        weights: str = "bf16",
    ):
        self.model = model.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.eos_token_ids = torch.tensor(sorted(set(eos_token_ids)), dtype=torch.long, device=self.device)
        self.pad_token_id = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else int(eos_token_ids[0])
        )
        self.generation_batch_size = generation_batch_size
        self._params = dict(self.model.named_parameters())
        # "auto": CUDA-graph decode on a GPU for supported architectures, else HF forward + dynamic cache
        if decode not in ("auto", "dynamic", "static", "cuda_graph"):
            raise ValueError(f"decode must be auto, dynamic, static or cuda_graph, got {decode!r}")
        static_ok = supports_static_decoding(self.model)
        if decode == "auto":
            decode = "cuda_graph" if (static_ok and self.device.type == "cuda") else "dynamic"
        if decode in ("static", "cuda_graph") and not static_ok:
            log.warning(
                "decode=%s is not supported for %s; using the HF forward",
                decode,
                self.model.config.model_type,
            )
            decode = "dynamic"
        if decode == "cuda_graph" and self.device.type != "cuda":
            decode = "static"
        self.decode = decode
        if decode != "dynamic":
            fuse_projections(self.model)
        if weights not in ("bf16", "nvfp4"):
            raise ValueError(f"weights must be bf16 or nvfp4, got {weights!r}")
        # NVFP4 rollouts: decode steps multiply by the 4-bit codes (W4A16) that each sync delivers;
        # the HF forward (decode=dynamic) has no place for them and decodes from their BF16 values
        self.codes = None
        if weights == "nvfp4" and decode != "dynamic":
            from slime_gb10.grpo.engines.torch.nvfp4_weights import EngineCodes

            self.codes = EngineCodes.for_model(self.model, self._params)
            if self.codes is not None:
                self.codes.quantize_own_weights()
        self.broken_sync: str | None = None  # why the last weight sync stopped midway, if it did
        # None: compile where it was measured to pay (issue #27: shape B's rollout 2.18 -> 1.20 s on an
        # H100), i.e. with CUDA graphs; on a CPU the compile costs more than it saves in a short run
        if compile_decode is None:
            compile_decode = decode == "cuda_graph"
        self.compile_decode = bool(compile_decode) and decode != "dynamic"
        if self.compile_decode:
            # One compiled graph per StaticDecoder (batch, cache length): more than dynamo's default
            # of 8 per function in a long run with evaluations; past the limit it would run eagerly.
            from torch._dynamo import config as dynamo_config

            dynamo_config.cache_size_limit = max(dynamo_config.cache_size_limit, 64)
        self._decoders: dict[tuple[int, int], StaticDecoder] = {}
        self._graphs: dict[tuple[int, int], _GraphedStep] = {}
        self.graph_fallback: str | None = None  # why CUDA-graph decoding was turned off, if it was
        log.info("torch rollout engine: %s decoding on %s", self.decode, self.device)

    # ---------------------------------------------------------------- generation
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        if not prompts:
            return []
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        if self.broken_sync is not None:
            raise RuntimeError(
                f"the last weight sync stopped midway ({self.broken_sync}): the engine holds a mix of old "
                "and new weights; sync again before generating"
            )
        # Row i samples with key seed + i (SGLang's engine gives request i sampling_seed seed + i too):
        # a row's completion does not depend on the other rows of the call or on the batching.
        seed = int(params.seed) if params.seed is not None else int(torch.randint(0, 2**62, ()).item())
        keys = torch.arange(len(prompts), dtype=torch.long) + seed
        # Sorting by length makes batches of similar lengths (less padding); results go back in order.
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        batch_size = self.generation_batch_size or len(prompts)
        results: list[Generation | None] = [None] * len(prompts)
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            run = self._generate_batch if self.decode == "dynamic" else self._generate_batch_static
            row_keys = keys[idx].to(self.device)
            for i, gen in zip(idx, run([list(prompts[i]) for i in idx], params, row_keys)):
                results[i] = gen
        return results  # type: ignore[return-value]

    @torch.inference_mode()
    def _generate_batch(
        self, prompts: list[list[int]], params: SamplingParams, keys: torch.Tensor
    ) -> list[Generation]:
        from transformers import DynamicCache

        input_ids, valid = self._left_pad(prompts)
        batch = len(prompts)
        attention_mask = valid.long()
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        next_position = attention_mask.sum(-1, keepdim=True)

        cache = DynamicCache(config=self.model.config)  # filled in place by every forward
        cache_kwarg = {_cache_keyword(self.model): cache}
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
            logits_to_keep=1,
            **cache_kwarg,
        )
        position = next_position

        def advance(token: torch.Tensor, step: int) -> torch.Tensor:
            nonlocal attention_mask, position
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones((batch, 1))], dim=1)
            step_out = self.model(
                input_ids=token[:, None],
                attention_mask=attention_mask,
                position_ids=position,
                use_cache=True,
                **cache_kwarg,
            )
            position = position + 1
            return step_out.logits[:, -1, :]

        tokens, logprobs, stop_hit = self._decode_loop(out.logits[:, -1, :], advance, params, keys)
        return self._finish(prompts, tokens, logprobs, stop_hit, params)

    def _left_pad(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """``[B, width]`` token ids padded on the left to the longest prompt and the mask of real
        tokens, on the device (built as one list: three tensor ops per row were ~2 ms of a rollout
        of 160 rows)."""
        width = max(len(p) for p in prompts)
        input_ids = torch.tensor([[self.pad_token_id] * (width - len(p)) + list(p) for p in prompts])
        lengths = torch.tensor([len(p) for p in prompts])
        valid = torch.arange(width) >= (width - lengths)[:, None]
        return input_ids.to(self.device), valid.to(self.device)

    def _record(self, token: torch.Tensor, finished: torch.Tensor, step: int) -> torch.Tensor:
        """The recorded token of each row (the pad token once a row has finished); rows whose
        recorded token is an end of sequence join ``finished`` (in place)."""
        return step_kernel.pad_and_mark(token, finished, self.eos_token_ids, self.pad_token_id)

    def _decode_loop(self, logits, advance, params: SamplingParams, keys: torch.Tensor, record=None):
        """The per-token loop both decode paths share.

        Sample from ``logits`` [B, V], pad rows that already finished, finish rows on EOS or a stop
        string, and stop at the token budget or (one host sync every 4 steps) once every row is done.
        ``record(token, finished, step)`` (default :meth:`_record`) pads and marks the sampled
        tokens; ``advance(token, step)`` runs the model one step and returns the next logits.
        """
        record = record or self._record
        batch = logits.shape[0]
        finished = torch.zeros(batch, dtype=torch.bool, device=logits.device)
        tokens: list[torch.Tensor] = []
        logprobs: list[torch.Tensor] = []
        stop_hit = [False] * batch
        # every step's draws in one go ([steps, B]; the same numbers as step by step): the ~60 small
        # integer ops of the hash run once per generation instead of once per token
        steps = torch.arange(params.max_new_tokens, device=keys.device)
        uniforms = row_uniforms(keys[None, :], steps[:, None])
        all_finished = stops.AllFinished(logits.device)
        for step in range(params.max_new_tokens):
            token, logprob = sample_next_token(logits, params, uniforms=uniforms[step])
            token = record(token, finished, step)
            tokens.append(token)
            logprobs.append(logprob)
            # stops are looked for every 4 steps (a host sync each time): a row that stopped runs
            # at most 3 tokens on, which _finish cuts off again (stops.cut_at_stop)
            if (params.stop or params.stop_regex) and (step % 4 == 3 or step == params.max_new_tokens - 1):
                finished |= stops.rows_stopped(self.tokenizer, tokens, finished, params, stop_hit)
            if step == params.max_new_tokens - 1:
                break
            if step % 4 == 3 and all_finished.check(finished):
                break
            logits = advance(token, step)
        return tokens, logprobs, stop_hit

    def _finish(self, prompts, tokens, logprobs, stop_hit, params) -> list[Generation]:
        stacked = torch.stack(tokens, dim=1)  # [B, steps]
        # each row's length up to and including its first EOS, found on the device: a Python scan
        # of 160 x 512 tokens took ~10 ms of a rollout of shape B (issue #27)
        is_eos = torch.isin(stacked, self.eos_token_ids)
        ends = torch.where(is_eos.any(dim=1), is_eos.int().argmax(dim=1) + 1, 0).cpu().tolist()
        token_rows = stacked.cpu().tolist()
        logprob_rows = torch.stack(logprobs, dim=1).float().cpu().tolist()
        rows = []  # (completion, logprobs, finish reason) up to and including the first EOS
        for row_tokens, row_logprobs, end in zip(token_rows, logprob_rows, ends):
            if end:
                rows.append((row_tokens[:end], row_logprobs[:end], "stop"))
            else:
                rows.append((row_tokens, row_logprobs, "length"))
        texts = decode_texts(self.tokenizer, [completion for completion, _, _ in rows])
        generations = []
        for row, ((completion, row_logprobs, reason), text) in enumerate(zip(rows, texts)):
            if stop_hit[row]:
                reason = "stop"
                completion, row_logprobs, text = stops.cut_at_stop(
                    self.tokenizer, completion, row_logprobs, params
                )
            generations.append(
                Generation(
                    prompt_ids=list(prompts[row]),
                    completion_ids=completion,
                    completion_logprobs=row_logprobs,
                    text=text,
                    finish_reason=reason,
                )
            )
        return generations

    @torch.inference_mode()
    def _generate_batch_static(
        self, prompts: list[list[int]], params: SamplingParams, keys: torch.Tensor
    ) -> list[Generation]:
        """Static KV cache; decode steps replayed from a CUDA graph when ``decode == "cuda_graph"``."""
        input_ids, valid = self._left_pad(prompts)
        batch, width = input_ids.shape
        cache_len = -(-(width + params.max_new_tokens) // 64) * 64  # round up: few distinct graphs
        key = (batch, cache_len)
        decoder = self._decoders.get(key)
        if decoder is None:
            decoder = self._decoders[key] = StaticDecoder(self.model, batch, cache_len)
            if self.compile_decode:
                compile_decode_step(decoder)
        logits = self._prefill(decoder, prompts, input_ids, valid)

        step_inputs = self._graphs.get(key) if self.decode == "cuda_graph" else None
        if step_inputs is None:
            step_inputs = _GraphedStep(decoder)
        step_inputs.mask.zero_()
        step_inputs.mask[:, 0, 0, :width] = valid
        step_inputs.position_ids.copy_(valid.long().sum(-1, keepdim=True))

        # the recorded token is the next step's input: one kernel on a GPU pads and marks the
        # tokens and writes the graph's inputs (step_kernel.py), the twin's eight ops elsewhere
        fused = step_kernel.applies(logits)
        feed = step_kernel.record_and_feed if fused else step_kernel.record_and_feed_reference
        inputs = (
            step_inputs.input_ids,
            step_inputs.position_ids,
            step_inputs.cache_position,
            step_inputs.mask,
        )

        def record(token: torch.Tensor, finished: torch.Tensor, step: int) -> torch.Tensor:
            return feed(
                token, finished, self.eos_token_ids, self.pad_token_id, *inputs, width + step, int(step > 0)
            )

        def advance(token: torch.Tensor, step: int) -> torch.Tensor:
            return self._decode_step(key, step_inputs, attention_length(width + step, cache_len))

        tokens, logprobs, stop_hit = self._decode_loop(logits, advance, params, keys, record)
        return self._finish(prompts, tokens, logprobs, stop_hit, params)

    @staticmethod
    def _prefill(
        decoder: StaticDecoder, prompts, input_ids: torch.Tensor, valid: torch.Tensor
    ) -> torch.Tensor:
        """The prompts' K/V into ``decoder``'s cache and the last position's logits ``[B, V]``.

        GRPO asks for each prompt G times: the distinct prompts are run once (a decoder of their own,
        shape B's 160 rows are 20 prompts) and their K/V and logits copied to every row that has
        them; the issue #27 idea of a prefill "batched once per group". The rows' samples differ from
        the first token on, each row drawing from its own key."""
        device, width = input_ids.device, input_ids.shape[1]
        index: dict[tuple[int, ...], int] = {}
        which = [index.setdefault(tuple(p), len(index)) for p in prompts]  # each row's distinct prompt
        shared = len(index) < len(prompts)
        runner = decoder
        if shared:
            firsts = []  # the first row of each distinct prompt
            for row, w in enumerate(which):
                if w == len(firsts):
                    firsts.append(row)
            # both indices cross to the device before the prefill is queued: a copy from the host
            # waits for the stream, and after the prefill it would wait for all of it
            rows = torch.tensor(firsts + which, device=device)
            firsts, expand = rows[: len(firsts)], rows[len(firsts) :]
            input_ids, valid = input_ids[firsts], valid[firsts]
            runner = StaticDecoder(decoder.model, len(index), width)
        position_ids = (valid.long().cumsum(-1) - 1).clamp(min=0)
        # prefill mask [B, 1, W, W]: causal, valid keys only; a padding query sees itself (no empty rows -> no NaN)
        causal = torch.tril(torch.ones((width, width), dtype=torch.bool, device=device))
        eye = torch.eye(width, dtype=torch.bool, device=device)
        mask = ((causal[None] & valid[:, None, :]) | eye[None])[:, None]
        logits = runner.forward(input_ids, position_ids, torch.arange(width, device=device), mask)
        if not shared:
            return logits
        for cache, prefilled in zip((*decoder.keys, *decoder.values), (*runner.keys, *runner.values)):
            cache[:, :, :width] = prefilled[expand]
        return logits[expand]

    def _decode_step(self, key, step_inputs: _GraphedStep, length: int) -> torch.Tensor:
        if self.decode != "cuda_graph":
            return step_inputs.run(length)
        if length not in step_inputs.graphs:
            try:
                self._capture_checked(key, step_inputs, length)
            except Exception as exc:
                decoder = step_inputs.decoder
                if decoder.step != decoder.forward:  # compiling failed: capture the plain step instead
                    log.warning("compiled decode step unusable (%s); using the uncompiled one", exc)
                    self.compile_decode = False
                    for other in self._decoders.values():
                        other.step = other.forward
                    step_inputs.graphs.clear()
                    return self._decode_step(key, step_inputs, length)
                # any capture problem: stay correct, lose only speed
                log.warning("CUDA-graph decode disabled (%s); decoding eagerly with the static cache", exc)
                self.decode = "static"
                self.graph_fallback = str(exc)
                self._graphs.clear()
                return step_inputs.run(length)
            self._graphs[key] = step_inputs
        return step_inputs.replay(length)

    @staticmethod
    def _capture_checked(key, step_inputs: _GraphedStep, length: int) -> None:
        """Capture; the first replay must compute what the eager step computes (same inputs,
        idempotent cache writes), up to the rounding of the weight dtype (graph_replay_error)."""
        step_inputs.capture(length)
        eager = step_inputs.run(length)
        error = graph_replay_error(step_inputs.replay(length), eager)
        limit = GRAPH_REPLAY_TOLERANCE.get(eager.dtype, GRAPH_REPLAY_TOLERANCE[torch.bfloat16])
        if not error <= limit:
            raise RuntimeError(f"graph replay differs from eager: relative error {error:.3g} > {limit:g}")
        log.debug("CUDA graph for batch %d, cache %d, attention %d: replay error %.2g", *key, length, error)

    def stats(self) -> dict[str, float]:
        """``cuda_graph``: 1 while decode steps replay CUDA graphs, 0 after a fallback (or off a GPU)."""
        return {"cuda_graph": float(self.decode == "cuda_graph")}

    # ---------------------------------------------------------------- weights & memory
    @torch.no_grad()
    def update_weights(self, stream) -> None:
        from slime_gb10.grpo.engines.torch.nvfp4_weights import check_stream_form
        from slime_gb10.grpo.weight_sync import check_metadata

        check_stream_form(stream.names, expects_codes=self.codes is not None)
        expected = {name: (tuple(p.shape), p.dtype) for name, p in self._params.items()}
        if self.codes is not None:  # the quantized layers arrive as NVFP4 codes
            expected = {n: v for n, v in expected.items() if not self.codes.owns(n)} | self.codes.expected()
        check_metadata(
            stream.metadata,
            expected,
            receiver="rollout engine's model",
            exact=self.codes.expected() if self.codes is not None else (),
        )
        try:  # nothing was written before this point; from here on a failure leaves a mix
            self._receive(stream, expected)
        except BaseException as exc:
            self.broken_sync = f"{type(exc).__name__}: {exc}"[:300]
            raise
        self.broken_sync = None

    @torch.no_grad()
    def _receive(self, stream, expected: dict) -> None:
        from slime_gb10.grpo.weight_sync import receive

        seen = set()
        for name, tensor in receive(stream, device=self.device):
            if self.codes is not None and self.codes.owns(name):
                self.codes.receive(name, tensor)
                seen.add(name)
                continue
            param = self._params.get(name)
            if param is None:
                raise KeyError(
                    f"weight '{name}' from the trainer has no parameter in the rollout engine's model"
                )
            if tuple(param.shape) != tuple(tensor.shape):
                raise ValueError(
                    f"weight '{name}': trainer shape {tuple(tensor.shape)} != engine {tuple(param.shape)}"
                )
            param.copy_(tensor)
            seen.add(name)
        missing = set(expected) - seen
        if missing:
            raise KeyError(
                f"the weight stream did not carry {len(missing)} parameters, e.g. {sorted(missing)[:3]}"
            )
        if self.codes is not None:
            self.codes.finish()

    @property
    def receives_nvfp4_codes(self) -> bool:
        return self.codes is not None

    def sleep(self) -> None:
        """Nothing to hand over: the engine and the trainer share one process and one caching
        allocator, so training reuses freed blocks directly (``empty_cache`` would only add
        cudaFree/cudaMalloc churn every step). SGLang, a separate server, really releases memory."""

    def health_check(self) -> None:
        if self.model is None:
            raise RuntimeError("the torch rollout engine was shut down")

    def shutdown(self) -> None:
        self.model = None
        self._params = {}
        self.codes = None


def _cache_keyword(model) -> str:
    """The forward's KV-cache argument: ``cache`` in transformers >= 5.2x (``past_key_values`` is
    deprecated there and warns on every call), ``past_key_values`` before."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def engine_dtype(config, device: torch.device) -> torch.dtype:
    """BF16 weights for rollouts on a GPU (unless precision is float32); FP32 on a CPU."""
    if device.type == "cuda" and config.model.precision != "float32":
        return torch.bfloat16
    return torch.float32


def build_engine(config, tokenizer, device) -> TorchRolloutEngine:
    """Registry entry point: the engine loads its own copy of the model (weights synced by the trainer)."""
    from slime_gb10.grpo.models import eos_token_ids, load_causal_lm, resolve_model_path

    device = torch.device(device)
    path = resolve_model_path(config.model.name_or_path)
    model = load_causal_lm(
        path,
        dtype=engine_dtype(config, device),
        attn_implementation=config.model.attn_implementation,
        trust_remote_code=config.model.trust_remote_code,
    ).to(device)
    return TorchRolloutEngine(
        model,
        tokenizer,
        device,
        eos_token_ids=eos_token_ids(tokenizer, model),
        generation_batch_size=config.rollout.generation_batch_size,
        decode=config.rollout.decode,
        compile_decode=config.rollout.compile_decode,
        weights=config.rollout.weights,
    )
