"""Pair merging with a priority queue: the loop both BPE and SentencePiece run on one word.

Symbols sit in a doubly linked list over arrays. Every adjacent pair the vocabulary can merge is
pushed with its rank (BPE: merge rank; SentencePiece: the merged piece's place in score order) and
its left position, packed into one int so the heap compares machine-sized keys; the best pair pops
first, ties leftmost (llama.cpp's comparators order them so). A popped key is acted on only if the
pair now at its position still has that rank: a pair whose sides changed since it was pushed either
ranks differently (stale, skipped) or ranks the same, and then merging it here is exactly what its
own entry would do. Cost O(n log n) in the word's length, where rescanning the word for the best
pair after every merge (the textbook loop) is O(n^2).
"""

from __future__ import annotations

import heapq

_POS_BITS = 40
_POS_MASK = (1 << _POS_BITS) - 1


def merge_pairs(symbols: list[str], ranks: dict, *, joined: bool) -> list[str]:
    """Merge `symbols` by `ranks` (lower first): keyed by (left, right), or by left + right when `joined`."""
    n = len(symbols)
    if n < 2:
        return symbols
    text = list(symbols)  # "" once the symbol was merged into its left neighbour
    nxt = [*range(1, n), -1]
    prv = list(range(-1, n - 1))
    get = ranks.get
    heap = []
    for i in range(n - 1):
        r = get(text[i] + text[i + 1]) if joined else get((text[i], text[i + 1]))
        if r is not None:
            heap.append(r << _POS_BITS | i)
    heapq.heapify(heap)
    push, pop = heapq.heappush, heapq.heappop
    while heap:
        key = pop(heap)
        i = key & _POS_MASK
        left, j = text[i], nxt[i]
        if not left or j < 0:
            continue
        right = text[j]
        if (get(left + right) if joined else get((left, right))) != key >> _POS_BITS:
            continue
        merged = left + right
        text[i], text[j] = merged, ""
        k = nxt[j]
        nxt[i] = k
        if k >= 0:
            prv[k] = i
            r = get(merged + text[k]) if joined else get((merged, text[k]))
            if r is not None:
                push(heap, r << _POS_BITS | i)
        h = prv[i]
        if h >= 0:
            r = get(text[h] + merged) if joined else get((text[h], merged))
            if r is not None:
                push(heap, r << _POS_BITS | h)
    out = []
    i = 0
    while i >= 0:
        out.append(text[i])
        i = nxt[i]
    return out
