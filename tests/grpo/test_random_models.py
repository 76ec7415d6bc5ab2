"""Random-init models and the converted tokenizer (issue #40's first 1.5B and 7B runs on H100s
stopped at a NaN gradient norm): a random model's pad-token embedding is drawn like the others, so
a tokenizer that pads with the token opening every prompt no longer zeroes position 0 through all
layers (whose RMSNorm backward then grows the gradient by 1/sqrt(eps) a layer); a GGUF's tokenizer
gets the special tokens its metadata records."""

from __future__ import annotations

import copy
import types

import torch

from slime_gb10.grpo.models import load_causal_lm, special_tokens_from_config, write_random_model


def test_a_random_model_whose_pad_token_opens_each_prompt_has_finite_gradients(tokenizer, tmp_path):
    """The pad token = the chat template's first token (as transformers 5.17's conversion of
    SmolLM2's GGUF made it): its embedding row is drawn (transformers would leave it 0), and the
    gradient of a 16-layer model's logprobs reaches the embeddings finite and of the size of a
    2-layer model's (with the zero row: inf, then NaN)."""
    tok = copy.deepcopy(tokenizer)
    tok.pad_token = tok.bos_token  # <|im_start|>
    text = tok.apply_chat_template([{"role": "user", "content": "What is 7 + 5?"}], tokenize=False)
    ids = torch.tensor([tok(text, add_special_tokens=False).input_ids[:24]])
    assert int(ids[0, 0]) == tok.pad_token_id  # the first token of every prompt is the pad token
    grads = {}
    for layers in (2, 16):
        model = load_causal_lm(str(write_random_model(tmp_path / f"m{layers}", tok, num_layers=layers)),
                               dtype=torch.float32)  # fmt: skip
        row = model.get_input_embeddings().weight[tok.pad_token_id]
        assert 0.005 < float(row.detach().std()) < 0.05  # drawn with initializer_range 0.02, not zeros
        embeds = model.get_input_embeddings()(ids).detach().requires_grad_(True)
        logits = model(inputs_embeds=embeds).logits
        logits.log_softmax(-1)[0, :-1].gather(-1, ids[0, 1:, None]).sum().backward()
        grads[layers] = float(embeds.grad.abs().max())
        assert torch.isfinite(embeds.grad).all(), layers
    assert grads[16] < 100 * grads[2], grads


def test_a_converted_tokenizer_takes_the_special_tokens_its_model_config_records(tokenizer):
    """What transformers 5.17 converts from SmolLM2's GGUF (eos <|im_start|>, pad unset; checked by
    hand with transformers 5.17.0: CI's transformers converts it as the metadata says) gets the
    metadata's bos 1, eos 2, pad 2; a tokenizer that agrees is left as it is."""
    tok = copy.deepcopy(tokenizer)
    tok.eos_token = "<|im_start|>"
    tok.pad_token = "<|im_start|>"
    assert (tok.eos_token_id, tok.pad_token_id) == (1, 1)
    config = types.SimpleNamespace(bos_token_id=1, eos_token_id=2, pad_token_id=2)
    special_tokens_from_config(tok, config)
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (1, 2, 2)
    assert (tok.eos_token, tok.pad_token) == ("<|im_end|>", "<|im_end|>")
    agrees = copy.deepcopy(tokenizer)
    special_tokens_from_config(
        agrees, types.SimpleNamespace(bos_token_id=None, eos_token_id=[2], pad_token_id=99_999)
    )
    assert (agrees.eos_token, agrees.pad_token) == (tokenizer.eos_token, tokenizer.pad_token)


def test_a_cache_converted_before_the_fix_gets_its_configs_special_tokens_on_disk(
    tokenizer, tmp_path, monkeypatch
):
    """A conversion transformers 5.17 wrote before convert_gguf set the special tokens (its files say
    eos <|im_start|>) is mended in place when the cache is resolved, once: any reader of the files,
    transformers' own AutoTokenizer as SGLang uses it, then sees the config's eos and pad (2). The same
    files elsewhere are a user's model and stay as they are."""
    import json

    from transformers import AutoTokenizer

    from slime_gb10.grpo import models
    from slime_gb10.grpo.models import default_tokenizer_dir, repair_special_tokens

    monkeypatch.setenv("SLIME_GB10_CACHE", str(tmp_path / "cache"))
    tok = copy.deepcopy(tokenizer)
    tok.eos_token = tok.pad_token = "<|im_start|>"
    cached = tmp_path / "cache" / "smollm2-135m-instruct"
    for where in (cached, tmp_path / "elsewhere"):
        tok.save_pretrained(where)
        (where / "config.json").write_text(
            json.dumps({"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2})
        )
    assert AutoTokenizer.from_pretrained(cached).eos_token == "<|im_start|>"  # the test can fail
    assert default_tokenizer_dir() == cached
    mended = AutoTokenizer.from_pretrained(cached)
    assert (mended.bos_token_id, mended.eos_token, mended.pad_token_id) == (1, "<|im_end|>", 2)
    models._checked_tokens.clear()  # the check again, not the process's memory of it
    assert not repair_special_tokens(cached)  # once: the files agree now
    assert AutoTokenizer.from_pretrained(tmp_path / "elsewhere").eos_token == "<|im_start|>"
