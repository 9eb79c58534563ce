# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Typed twins of the streamed-INSERT receive loop, its encoder and the snapshot's COPY loop.

Each function is the twin of a pure-Python reference, kept as the tested reference and the
fallback when this module is not built (capture/compiled.py loads it):

    take_inserts(get_copy_data, run, room)    ~ the receive loop + SourceSession.handle for held INSERTs
    encode_inserts(spec, payloads, value_tail) ~ streaming.insert_template.InsertTemplate.encode_many_python
    take_copy(get_copy_data, buf, limit)      ~ snapshot.reader.take_copy_python

`encode_inserts` answers None whenever it is not sure to give the reference's very bytes (an odd
shape, a value rule that declines, an LSN wider than 8 hex digits); the caller then runs the
reference, so the output is always the reference's.
"""

from libc.stdint cimport uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memchr, memcmp, memcpy

cdef extern from "string.h" nogil:
    void *memrchr(const void *s, int c, size_t n)

cdef const char *SPLIT = b',"value":'
cdef Py_ssize_t SPLIT_LEN = 9
cdef const char *INSERT_HEAD = b'{"action":"I",'
cdef Py_ssize_t INSERT_HEAD_LEN = 14
cdef const char *LSN_KEY = b',"lsn":'
cdef Py_ssize_t LSN_KEY_LEN = 7
cdef Py_ssize_t XLOG_HEADER = 25  # 'w', dataStart, walEnd, sendTime

# the byte rules' codes (insert_template._C_CODES); a callable is the generic rule
cdef enum:
    R_PASS = 0
    R_NUMERIC = 1
    R_TSTZ = 2
    R_TS = 3
    R_BYTEA = 4
    R_TEXT = 5
    R_CALL = 6


def take_inserts(object get_copy_data, list run, Py_ssize_t room):
    """Held INSERT documents from libpq (psycopg's non-blocking `get_copy_data(1)`) onto `run`, at
    most `room`: None when it took `room` or nothing is buffered (the caller compares len(run));
    the first other message's (n, data), untouched, for the caller's usual path."""
    cdef Py_ssize_t taken = 0, size
    cdef const unsigned char[::1] view
    cdef const char *b
    while taken < room:
        got = get_copy_data(1)
        n, data = got
        if not isinstance(n, int):
            return got
        if n == 0:
            return None
        if n < 0:
            return got
        try:
            view = data
        except (TypeError, ValueError, BufferError):
            return got  # not a buffer: the caller's path says what it is
        size = view.shape[0]
        if size < XLOG_HEADER + 12:
            return got
        b = <const char *>&view[0]
        if b[0] != b'w' or b[XLOG_HEADER + 11] != b'I':
            return got
        run.append(b[XLOG_HEADER:size])
        taken += 1
    return None


def take_copy(object get_copy_data, bytearray buf, Py_ssize_t limit):
    """COPY rows from libpq onto `buf` while it is shorter than `limit`: 1 when it reached `limit`,
    else get_copy_data's first n <= 0 (0: nothing buffered, -1: the COPY ended, -2: it failed)."""
    while len(buf) < limit:
        n, data = get_copy_data(1)
        if n <= 0:
            return n
        buf += data  # a copy frees libpq's buffer at once
    return 1


cdef inline bint is_null(const char *t, Py_ssize_t n) noexcept nogil:
    return n == 4 and memcmp(t, b"null", 4) == 0


cdef inline bint ends_with(const char *t, Py_ssize_t n, const char *suffix, Py_ssize_t k) noexcept nogil:
    return n >= k and memcmp(t + n - k, suffix, <size_t>k) == 0


cdef inline Py_ssize_t find_byte(const char *t, Py_ssize_t n, char c) noexcept nogil:
    cdef const char *p
    if n <= 0:
        return -1
    p = <const char *>memchr(t, c, <size_t>n)
    return -1 if p == NULL else p - t


cdef const char *find_sub(const char *t, Py_ssize_t n, const char *needle, Py_ssize_t k,
                          Py_ssize_t anchor) noexcept nogil:
    """The leftmost `needle` (k bytes) in t[0:n], or NULL: memchr for needle[anchor], a byte chosen
    to be rare in the haystack, then one compare."""
    cdef const char *p = t + anchor
    cdef const char *last = t + n - k + anchor
    if n < k:
        return NULL
    while p <= last:
        p = <const char *>memchr(p, needle[anchor], <size_t>(last - p + 1))
        if p == NULL:
            return NULL
        if memcmp(p - anchor, needle, <size_t>k) == 0:
            return p - anchor
        p += 1
    return NULL


cdef inline const char *find_split(const char *t, Py_ssize_t n) noexcept nogil:
    return find_sub(t, n, SPLIT, SPLIT_LEN, 2)  # by its `v`: no other key of a document has one


cdef inline Py_ssize_t u64_len(uint64_t v) noexcept nogil:
    cdef Py_ssize_t n = 1
    while v >= 10:
        v //= 10
        n += 1
    return n


cdef inline char *put_u64(char *d, uint64_t v) noexcept nogil:
    cdef Py_ssize_t n = u64_len(v)
    cdef char *end = d + n
    while True:
        end -= 1
        end[0] = <char>(48 + v % 10)
        v //= 10
        if v == 0:
            break
    return d + n


cdef inline char *put(char *d, const char *s, Py_ssize_t n) noexcept nogil:
    memcpy(d, s, <size_t>n)
    return d + n


cdef long long hex32(const char *t, Py_ssize_t n) noexcept nogil:
    """1 to 8 hex digits → value; -1 for anything else (the caller declines)."""
    cdef long long v = 0
    cdef Py_ssize_t i
    cdef char c
    cdef int d
    if n < 1 or n > 8:
        return -1
    for i in range(n):
        c = t[i]
        if b'0' <= c <= b'9':
            d = c - 48
        elif b'a' <= c <= b'f':
            d = c - 87
        elif b'A' <= c <= b'F':
            d = c - 55
        else:
            return -1
        v = v * 16 + d
    return v


cdef Py_ssize_t rule_len(int rule, const char *t, Py_ssize_t n) noexcept nogil:
    """One value token → its envelope spelling's length, or -1: not sure (the run declines)."""
    if rule == R_PASS:
        return n
    if rule == R_NUMERIC:
        # "-0" would parse to the int 0; a quoted token or nothing is not a numeric we know
        if is_null(t, n):
            return 4
        if n == 0 or (n == 2 and t[0] == b'-' and t[1] == b'0') or t[0] == b'"':
            return -1
        return n + 2
    if rule == R_TSTZ:
        # "YYYY-MM-DD hh:mm:ss[.f]+00" → "YYYY-MM-DDThh:mm:ss[.f]Z"; a second `+00"` would make the
        # column-wise reference differ: decline
        if n >= 6 and t[5] == b'-' and find_byte(t, n, b' ') == 11 and ends_with(t, n, b'+00"', 4):
            return -1 if find_sub(t, n - 1, b'+00"', 4, 0) != NULL else n - 2
        return 4 if is_null(t, n) else -1
    if rule == R_TS:
        if n >= 6 and t[5] == b'-' and find_byte(t, n, b' ') == 11 and not ends_with(t, n, b' BC"', 4):
            return n
        return 4 if is_null(t, n) else -1
    if rule == R_BYTEA:
        if is_null(t, n) or (n >= 1 and t[0] == b'"' and find_byte(t, n, b'\\') < 0):
            return n
        return -1
    if rule == R_TEXT:
        if ((n >= 1 and t[0] == b'"') or (n >= 4 and memcmp(t, b"null", 4) == 0)) and find_sub(
            t, n, b"\\u", 2, 0
        ) == NULL:
            return n
        return -1
    return -1


cdef char *rule_put(char *d, int rule, const char *t, Py_ssize_t n) noexcept nogil:
    """Write what rule_len measured."""
    if is_null(t, n) and (rule == R_NUMERIC or rule == R_TSTZ or rule == R_TS):
        return put(d, b"null", 4)
    if rule == R_NUMERIC:
        d[0] = b'"'
        d = put(d + 1, t, n)
        d[0] = b'"'
        return d + 1
    if rule == R_TSTZ:
        d = put(d, t, 11)
        d[0] = b'T'
        d = put(d + 1, t + 12, n - 16)
        return put(d, b'Z"', 2)
    if rule == R_TS:
        d = put(d, t, n)
        (d - n + 11)[0] = b'T'
        return d
    return put(d, t, n)


cdef struct Tok:
    Py_ssize_t start  # the token within its payload
    Py_ssize_t len
    Py_ssize_t out_len  # its envelope spelling's length


cdef inline char *put_field(char *d, int r, list gen, Py_ssize_t at, const Tok *t, const char *b):
    """One column's envelope spelling: the generic rule's answer (`gen[at]`), else the typed rule's."""
    cdef bytes got
    if r == R_CALL:
        got = <bytes>gen[at]
        return put(d, got, t.out_len)
    return rule_put(d, r, b + t.start, t.len)


def encode_inserts(tuple spec, list payloads, bytes value_tail):
    """`InsertTemplate.encode_many_python`'s (keys, values) for a run of one table's INSERTs, or None.

    spec = (ends, rules, tag_len, key_at, key_pieces, value_pieces), built once per template:
    each column's constant end after its value token, its rule (a code, or a callable token →
    bytes | None), the length of the table tag ending every head, the key's columns, and the
    constant pieces around the key's and the value's tokens (the last value piece ends with the
    source's `"lsn":`). The value is value_pieces interleaved with the tokens, the LSN in decimal,
    then value_tail."""
    cdef tuple ends, rules, key_at, kps, vps
    if len(spec) != 6:
        raise TypeError("spec must be a 6-tuple")
    ends, rules, tag_obj, key_at, kps, vps = spec
    cdef Py_ssize_t m = len(ends), nkey = len(key_at), tag_len = tag_obj
    cdef tuple docs = tuple(payloads)  # a generic rule's Python code cannot free one under us
    cdef Py_ssize_t n = len(docs)
    if m < 1 or len(rules) != m or nkey < 1 or len(kps) != nkey + 1 or len(vps) != m + 1 or tag_len < 1:
        raise ValueError("spec: one rule per column, one piece more than tokens, a tag")
    if n == 0:
        return None
    cdef list gen = None  # the generic rule's answers, [i * m + j]
    cdef int *rule = <int *>malloc(m * sizeof(int))
    cdef Py_ssize_t *kat = <Py_ssize_t *>malloc(nkey * sizeof(Py_ssize_t))
    cdef Tok *toks = <Tok *>malloc(n * m * sizeof(Tok))
    cdef uint64_t *lsns = <uint64_t *>malloc(n * sizeof(uint64_t))
    cdef char *scratch = NULL
    cdef Py_ssize_t i, j, k, start, stop, length, h0_len, pre, prefix, h_len, lsn_len, slash, klen, vlen
    cdef Py_ssize_t key_fixed = 0, value_fixed = 0, widest = 0, tail_len = len(value_tail)
    cdef long long hi, lo
    cdef const char *b
    cdef const char *p
    cdef const char *q
    cdef const char *h0
    cdef const char *quote
    cdef const char *lsn
    cdef const char *tail = value_tail
    cdef char *d
    cdef bytes piece
    cdef list keys, values
    cdef Tok *t
    try:
        if rule == NULL or kat == NULL or toks == NULL or lsns == NULL:
            raise MemoryError()
        for j in range(m):
            r = rules[j]
            if isinstance(r, int):
                if not R_PASS <= r <= R_TEXT:
                    raise ValueError("spec: unknown rule code")
                rule[j] = r
            elif callable(r):
                rule[j] = R_CALL
                if gen is None:
                    gen = [None] * (n * m)
            else:
                raise TypeError("spec: a rule is an int code or a callable")
            if len(<bytes?>ends[j]) < 1:
                raise ValueError("spec: a piece's end is never empty")
        for k in range(nkey):
            kat[k] = key_at[k]
            if kat[k] < 0 or kat[k] >= m:
                raise ValueError("spec: key_at out of range")
        for k in range(nkey + 1):
            key_fixed += len(<bytes?>kps[k])
        for j in range(m + 1):
            value_fixed += len(<bytes?>vps[j])

        # 1. split each document at `,"value":` (exactly m times) and check every constant end
        for i in range(n):
            doc = docs[i]
            if type(doc) is not bytes:
                return None
            b = <bytes>doc
            length = len(<bytes>doc)
            p = find_split(b, length)
            if p == NULL:
                return None
            for j in range(m):
                start = (p - b) + SPLIT_LEN
                q = find_split(b + start, length - start)
                if (q == NULL) != (j == m - 1):
                    return None  # fewer or more pieces than the template's
                stop = length if q == NULL else q - b
                piece = <bytes>ends[j]
                if not ends_with(b + start, stop - start, piece, len(piece)):
                    return None
                t = &toks[i * m + j]
                t.start = start
                t.len = stop - start - len(piece)
                p = q

        # 2. each column's rule over every token
        for j in range(m):
            for i in range(n):
                t = &toks[i * m + j]
                b = <bytes>docs[i]
                if rule[j] == R_CALL:
                    got = rules[j](b[t.start : t.start + t.len])
                    if type(got) is not bytes:
                        return None
                    gen[i * m + j] = got
                    t.out_len = len(<bytes>got)
                else:
                    t.out_len = rule_len(rule[j], b + t.start, t.len)
                    if t.out_len < 0:
                        return None

        # 3. the heads: the same up to the LSN's text (`{"action":"I",…,"lsn":"`), then `X/Y"`
        h0 = <bytes>docs[0]
        h0_len = toks[0].start - SPLIT_LEN - tag_len
        if h0_len <= 0:
            return None
        quote = <const char *>memrchr(h0, b'"', <size_t>h0_len)
        if quote == NULL:
            return None
        pre = quote - h0
        prefix = pre + 1
        if pre < INSERT_HEAD_LEN or memcmp(h0, INSERT_HEAD, INSERT_HEAD_LEN) != 0 or not ends_with(
            h0, pre, LSN_KEY, LSN_KEY_LEN
        ):
            return None
        for i in range(n):
            b = <bytes>docs[i]
            h_len = toks[i * m].start - SPLIT_LEN
            if h_len < prefix or memcmp(b, h0, <size_t>prefix) != 0:
                return None
            lsn_len = h_len - tag_len - prefix
            lsn = b + prefix
            slash = find_byte(lsn, lsn_len, b'/') if lsn_len > 0 else -1
            if slash < 0:
                return None
            hi = hex32(lsn, slash)
            lo = hex32(lsn + slash + 1, lsn_len - slash - 1)
            if hi < 0 or lo < 0:
                return None
            lsns[i] = ((<uint64_t>hi) << 32) | <uint64_t>lo

        # 4. keys and values, each written into one scratch buffer and copied out at its exact size
        for i in range(n):
            vlen = len(<bytes>docs[i])
            if vlen > widest:
                widest = vlen
        widest = 2 * widest + value_fixed + key_fixed + tail_len + 64  # a token grows by 2 at most
        scratch = <char *>malloc(widest)
        if scratch == NULL:
            raise MemoryError()
        keys = [None] * n
        values = [None] * n
        for i in range(n):
            b = <bytes>docs[i]
            t = &toks[i * m]
            klen = key_fixed
            vlen = value_fixed + u64_len(lsns[i]) + tail_len
            for k in range(nkey):
                klen += t[kat[k]].out_len
            for j in range(m):
                vlen += t[j].out_len
            if klen > widest or vlen > widest:  # a generic rule's answer longer than its token
                free(scratch)
                widest = 2 * (klen if klen > vlen else vlen)
                scratch = <char *>malloc(widest)
                if scratch == NULL:
                    raise MemoryError()
            d = scratch
            for k in range(nkey):
                j = kat[k]
                piece = <bytes>kps[k]
                d = put(d, piece, len(piece))
                d = put_field(d, rule[j], gen, i * m + j, &t[j], b)
            piece = <bytes>kps[nkey]
            d = put(d, piece, len(piece))
            keys[i] = scratch[:klen]
            d = scratch
            for j in range(m):
                piece = <bytes>vps[j]
                d = put(d, piece, len(piece))
                d = put_field(d, rule[j], gen, i * m + j, &t[j], b)
            piece = <bytes>vps[m]
            d = put(d, piece, len(piece))
            d = put_u64(d, lsns[i])
            d = put(d, tail, tail_len)
            values[i] = scratch[:vlen]
        return keys, values
    finally:
        free(rule)
        free(kat)
        free(toks)
        free(lsns)
        free(scratch)
