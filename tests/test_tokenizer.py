"""Tests of the bundled tokenizer, its training script and the Tokenizer wrapper."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from dist_helpers import REPO
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers

from torchtitan_lite.data.corpus import shakespeare_plays
from torchtitan_lite.data.tokenizer import BUNDLED_TOKENIZER, Tokenizer, build_tokenizer
from torchtitan_lite.errors import InputError


def _word_level(path: Path, vocab: dict[str, int]) -> Path:
    """A word-level tokenizer.json with the given vocab, split on whitespace."""
    tok = HFTokenizer(models.WordLevel(vocab, unk_token=next(iter(vocab))))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(path))
    return path


def test_bundled_tokenizer_has_2048_ids_and_eos_zero():
    tok = build_tokenizer()
    assert tok.path == str(BUNDLED_TOKENIZER)
    assert tok.vocab_size == 2048
    assert tok.eos_id == 0
    assert tok.decode([tok.eos_id]) == "<|endoftext|>"


def test_round_trip_on_shakespeare_lines():
    tok = build_tokenizer()
    ((_, tempest),) = shakespeare_plays("validation")
    odd = ["Now stops thy spring; my sea sha$l suck them dry — & c.", "  two  spaces\n\n"]
    lines = tempest.splitlines()[:400] + odd
    ids = tok.encode_batch(lines)
    assert ids == [tok.encode(line) for line in lines]
    assert [tok.decode(i) for i in ids] == lines


def test_validation_play_token_count_is_pinned():
    # Pins the bundled file: 95,944 characters of The Tempest -> 36,777 tokens (2.61 chars/token).
    ((_, tempest),) = shakespeare_plays("validation")
    assert len(tempest) == 95_944
    assert len(build_tokenizer().encode(tempest)) == 36_777


def test_eos_in_text_is_one_token():
    tok = build_tokenizer()
    ids = tok.encode("Exeunt<|endoftext|>ACT I")
    assert ids.count(tok.eos_id) == 1
    assert tok.decode(ids) == "Exeunt<|endoftext|>ACT I"


def test_training_script_is_deterministic_and_reproduces_the_bundled_file(tmp_path):
    outputs = []
    for run in range(2):
        out = tmp_path / f"tokenizer_{run}.json"
        subprocess.run(
            [sys.executable, "-m", "scripts.train_tokenizer", "--output", str(out)],
            cwd=REPO,
            check=True,
            capture_output=True,
            timeout=120,
        )
        outputs.append(out.read_bytes())
    assert outputs[0] == outputs[1]
    assert outputs[0] == BUNDLED_TOKENIZER.read_bytes()


def test_vocab_size_is_largest_id_plus_one(tmp_path):
    # Like Qwen3's file: added tokens sit above the BPE ids; an embedding needs max id + 1 rows.
    path = _word_level(
        tmp_path / "t.json", {"<unk>": 0, "a": 1, "<|im_end|>": 151_644, "<|endoftext|>": 151_643}
    )
    tok = Tokenizer(path)
    assert (tok.vocab_size, tok.eos_id) == (151_645, 151_643)


def test_eos_token_parameter_and_known_names(tmp_path):
    path = _word_level(tmp_path / "t.json", {"<unk>": 0, "</s>": 1, "<custom_eos>": 2})
    assert Tokenizer(path).eos_id == 1
    assert Tokenizer(path, eos_token="<custom_eos>").eos_id == 2


def test_missing_file_names_the_path(tmp_path):
    with pytest.raises(InputError, match="tokenizer file not found: .*nope.json"):
        build_tokenizer(str(tmp_path / "nope.json"))


def test_unreadable_file_names_the_path(tmp_path):
    path = tmp_path / "garbage.json"
    path.write_text("not json")
    with pytest.raises(ValueError, match="garbage.json"):
        build_tokenizer(str(path))


def test_no_eos_names_the_path_and_the_fix(tmp_path):
    path = _word_level(tmp_path / "noeos.json", {"<unk>": 0, "a": 1})
    with pytest.raises(ValueError, match=r"noeos.json has none of the EOS tokens.*eos_token"):
        build_tokenizer(str(path))
    with pytest.raises(ValueError, match="<mine>"):
        build_tokenizer(str(path), eos_token="<mine>")
