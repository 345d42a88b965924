"""GPT-2 byte-level map: every byte 0..255 <-> one printable unicode character.

Printable Latin-1 bytes map to themselves; the other 68 bytes map to U+0100.. in byte order,
so a BPE vocabulary never holds raw control bytes or spaces (space is 'Ġ', newline is 'Ċ').
"""

from __future__ import annotations


def _build() -> tuple[dict[int, str], dict[str, int]]:
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    kept = set(keep)
    to_char: dict[int, str] = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in kept:
            to_char[b] = chr(256 + extra)
            extra += 1
    return to_char, {c: b for b, c in to_char.items()}


BYTE_TO_CHAR, CHAR_TO_BYTE = _build()
# Latin-1 decodes byte b to chr(b); translating those characters is one pass in C.
_ENCODE_TABLE = {b: BYTE_TO_CHAR[b] for b in range(256)}


def encode_bytes(data: bytes) -> str:
    """Raw bytes -> the byte-level unicode string BPE merges operate on."""
    return data.decode("latin-1").translate(_ENCODE_TABLE)


def decode_chars(text: str) -> bytes:
    """A vocabulary token's text -> its raw bytes (characters outside the map pass through as UTF-8)."""
    out = bytearray()
    for ch in text:
        b = CHAR_TO_BYTE.get(ch)
        if b is None:
            out += ch.encode("utf-8")
        else:
            out.append(b)
    return bytes(out)
