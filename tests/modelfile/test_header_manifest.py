"""The GGUF prefix parser and the manifest, against gguf's own reader and the real model."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from gguf import GGUFReader

from swactor.modelfile import support
from swactor.modelfile.header import GgufFormatError, NeedMoreBytes, parse_header, read_header
from swactor.modelfile.manifest import Manifest, ManifestError, auto_piece_bytes, build_manifest
from tests.fixtures.synth_gguf import Shape, write_gguf

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / ".cache" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def header_of(path: Path):
    with open(path, "rb") as f:
        return read_header(lambda n: (f.seek(0), f.read(n))[1], first=4096)[0]


@pytest.mark.skipif(not MODEL.exists(), reason="run `make model`")
def test_header_matches_gguf_reader_on_the_real_model() -> None:
    h = header_of(MODEL)
    r = GGUFReader(MODEL)
    assert h.data_offset == r.data_offset
    by_name = h.tensor_map()
    assert len(by_name) == len(r.tensors)
    for t in r.tensors:
        mine = by_name[t.name]
        assert (h.data_offset + mine.offset, mine.nbytes) == (t.data_offset, t.n_bytes)
    for key, field in r.fields.items():
        if not key.startswith("GGUF."):
            assert field.contents() == h.metadata[key], key


def test_short_prefix_asks_for_more_and_garbage_is_named(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf")
    data = path.read_bytes()
    h = parse_header(data)
    with pytest.raises(NeedMoreBytes) as e:
        parse_header(data[:100])
    assert e.value.at_least > 100
    with pytest.raises(GgufFormatError, match="magic"):
        parse_header(b"GGML" + data[4:])
    with pytest.raises(GgufFormatError, match="version"):
        parse_header(data[:4] + (7).to_bytes(4, "little") + data[8:])
    with pytest.raises(GgufFormatError, match="ends at byte"):
        read_header(lambda n: data[:min(n, 200)], first=64)
    assert h.data_offset % 32 == 0 and h.tensors[0].name == "token_embd.weight"


def test_manifest_pieces_cover_exactly_header_and_tensors(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf", Shape(layers=3, dim=512, ffn=1024, vocab=1024))
    h = header_of(path)
    m = build_manifest(path, h, piece_bytes=64 << 10)
    data = path.read_bytes()
    assert m.file_sha256 == hashlib.sha256(data).hexdigest() and m.size == len(data)
    for p in m.pieces:
        assert hashlib.sha256(data[p.offset:p.end]).hexdigest() == p.sha256
        assert p.length <= 64 << 10
    assert m.pieces[m.header_pieces - 1].end == h.data_offset
    for t in h.tensors:
        first, count = m.tensors[t.name]
        start = h.data_offset + t.offset
        assert m.pieces[first].offset == start and m.pieces[first + count - 1].end == start + t.nbytes
    again = Manifest.decode(m.encode(), expect_digest=m.digest())
    assert again == m
    with pytest.raises(ManifestError, match="digest"):
        Manifest.decode(m.encode(), expect_digest="0" * 64)
    assert m.tensor_of(m.tensors["blk.1.ffn_up.weight"][0]) == "blk.1.ffn_up.weight"


def test_stage_tensors_follow_the_layer_range(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf", Shape(layers=4))
    names = {t.name for t in header_of(path).tensors}
    arch = support.ARCHITECTURES["llama"]
    first = support.stage_tensors(arch, names, 0, 2, 4)
    last = support.stage_tensors(arch, names, 2, 4, 4)
    assert first[0] == "token_embd.weight" and all(not t.startswith(("blk.2", "blk.3")) for t in first)
    assert "output_norm.weight" in last and "token_embd.weight" in last  # tied head
    assert not any(t.startswith(("blk.0", "blk.1")) for t in last)
    assert len(first) == 1 + 18 and len(last) == 18 + 2


def test_auto_piece_size_scales_with_the_file() -> None:
    assert auto_piece_bytes(100 << 20) == 256 << 10
    assert auto_piece_bytes(40 << 30) == 16 << 20


def _string_array_header(*strings: bytes, length: int | None = None) -> bytes:
    """A tensorless v3 header with one key: tokenizer.ggml.tokens = the strings (`length` overrides the last one's)."""
    key = b"tokenizer.ggml.tokens"
    out = b"GGUF" + (3).to_bytes(4, "little") + (0).to_bytes(8, "little") + (1).to_bytes(8, "little")
    out += len(key).to_bytes(8, "little") + key + (9).to_bytes(4, "little") + (8).to_bytes(4, "little")
    out += len(strings).to_bytes(8, "little")
    for i, s in enumerate(strings):
        n = length if length is not None and i == len(strings) - 1 else len(s)
        out += n.to_bytes(8, "little") + s
    return out


def test_a_vocabulary_reads_whole_or_asks_for_the_bytes_it_lacks() -> None:
    words = [b"a", b"", "é".encode(), b"<|im_end|>"]
    data = _string_array_header(*words)
    assert parse_header(data).get("tokenizer.ggml.tokens") == ["a", "", "é", "<|im_end|>"]
    for cut in range(len(data) - 1, 40, -1):  # every cut inside the array: asks for more than it has, never more than all
        with pytest.raises(NeedMoreBytes) as e:
            parse_header(data[:cut])
        assert cut < e.value.at_least <= len(data), cut
    assert read_header(lambda n: data[:n], first=48)[0].get("tokenizer.ggml.tokens")[-1] == "<|im_end|>"
    with pytest.raises(GgufFormatError, match=r"tokenizer.ggml.tokens: string at byte \d+ is not UTF-8"):
        parse_header(_string_array_header(b"ok", b"\xff\xfe"))
    with pytest.raises(GgufFormatError, match=r"tokenizer.ggml.tokens: string length 1099511627776 .* not plausible"):
        parse_header(_string_array_header(b"ok", b"x", length=1 << 40))
