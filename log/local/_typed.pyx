# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Typed twins of the log's per-record steps: a run of streamed INSERTs, a snapshot chunk.

    encode_plain(first_offset, timestamp_ms, keys, values) ~ codec.encode_plain_python
    encode_columns(first_offset, timestamp_ms, n, pieces)  ~ codec_arrow.encode_columns_python (the snapshot)
    split_partitions(keys, values, partitions)           ~ partitioner.split_partitions_python

`encode_plain` answers None whenever it is not sure to give the reference's very bytes (a NUL or
a newline in a field, a number wider than 64 bits, a field that is not bytes); the caller then runs
the reference. `split_partitions` hashes with the `murmurhash2` package, the log's one murmur2.
"""

from libc.limits cimport LLONG_MAX
from libc.stdlib cimport free, malloc
from libc.string cimport memchr, memcpy

from murmurhash2 import murmurhash2

cdef extern from "zlib.h" nogil:
    unsigned long crc32(unsigned long crc, const unsigned char *buf, unsigned int len)

cdef unsigned int SEED = 0x9747B28C

# {"offset":O,"timestamp":T,"lens":[K,V,4],"key":…,"value":…,"headers":null,"crc":C}\n
cdef const char *L_OFFSET = b'{"offset":'
cdef const char *L_TS = b',"timestamp":'
cdef const char *L_LENS = b',"lens":['
cdef const char *L_KEY = b',4],"key":'
cdef const char *L_VALUE = b',"value":'
cdef const char *L_HEADERS = b',"headers":null'
cdef const char *L_CRC = b',"crc":'
cdef Py_ssize_t LINE_FIXED = 10 + 13 + 9 + 1 + 10 + 9 + 15 + 7 + 2


cdef inline Py_ssize_t u64_len(unsigned long long v) noexcept nogil:
    cdef Py_ssize_t n = 1
    while v >= 10:
        v //= 10
        n += 1
    return n


cdef inline char *put_u64(char *d, unsigned long long v) noexcept nogil:
    cdef Py_ssize_t n = u64_len(v)
    cdef char *end = d + n
    while True:
        end -= 1
        end[0] = <char>(48 + v % 10)
        v //= 10
        if v == 0:
            break
    return d + n


cdef inline char *put_i64(char *d, long long v) noexcept nogil:
    if v < 0:
        d[0] = b'-'
        return put_u64(d + 1, <unsigned long long>0 - <unsigned long long>v)
    return put_u64(d, <unsigned long long>v)


cdef inline char *put(char *d, const char *s, Py_ssize_t n) noexcept nogil:
    memcpy(d, s, <size_t>n)
    return d + n


cdef inline char *close_line(const char *line, char *d) noexcept nogil:
    """The line's end, after its value: no headers, the CRC of everything before `,"crc":`, `}` and newline."""
    d = put(d, L_HEADERS, 15)
    cdef unsigned long crc = crc32(0, <const unsigned char *>line, <unsigned int>(d - line))
    d = put(d, L_CRC, 7)
    d = put_u64(d, crc)
    d[0] = b'}'
    d[1] = b'\n'
    return d + 2


cdef inline bint plain(object f):
    """The field may be spliced as is: bytes, without a NUL (the reference's separator) or a newline."""
    cdef const char *b
    cdef Py_ssize_t n
    if type(f) is not bytes:
        return False
    b = <bytes>f
    n = len(<bytes>f)
    return memchr(b, 0, <size_t>n) == NULL and memchr(b, 10, <size_t>n) == NULL


def encode_plain(object first_offset, object timestamp_ms, object keys, object values):
    """`codec.encode_plain_python`'s (lines, sizes) for records with one timestamp, no headers and
    no null key or value, or None (not sure: the reference runs)."""
    cdef long long first, ts
    try:
        first = first_offset
        ts = timestamp_ms
    except OverflowError:
        return None
    cdef tuple ks = tuple(keys), vs = tuple(values)
    cdef Py_ssize_t n = len(ks), i, kl, vl, bound = 0, ts_len
    if n == 0:
        return b"", []
    if len(vs) != n or first < 0 or first > LLONG_MAX - n:
        return None
    ts_len = (1 if ts < 0 else 0) + u64_len(<unsigned long long>0 - <unsigned long long>ts if ts < 0 else ts)
    for i in range(n):
        if not plain(ks[i]) or not plain(vs[i]):
            return None
        kl = len(<bytes>ks[i])
        vl = len(<bytes>vs[i])
        if kl > 0xFFFFFFF or vl > 0xFFFFFFF:  # the CRC's length is an unsigned int
            return None
        bound += LINE_FIXED + u64_len(first + i) + ts_len + u64_len(kl) + u64_len(vl) + 10 + kl + vl
    cdef char *buf = <char *>malloc(bound)
    if buf == NULL:
        raise MemoryError()
    cdef char *d = buf
    cdef char *line
    cdef list sizes = [0] * n
    cdef bytes k, v
    try:
        for i in range(n):
            k = <bytes>ks[i]
            v = <bytes>vs[i]
            kl = len(k)
            vl = len(v)
            line = d
            d = put(d, L_OFFSET, 10)
            d = put_u64(d, first + i)
            d = put(d, L_TS, 13)
            d = put_i64(d, ts)
            d = put(d, L_LENS, 9)
            d = put_u64(d, kl)
            d[0] = b','
            d = put_u64(d + 1, vl)
            d = put(d, L_KEY, 10)
            d = put(d, k, kl)
            d = put(d, L_VALUE, 9)
            d = put(d, v, vl)
            d = close_line(line, d)
            sizes[i] = d - line
        return buf[: d - buf], sizes
    finally:
        free(buf)


def split_partitions(list keys, list values, Py_ssize_t partitions):
    """Each partition's keys and values, in their order: Kafka's `toPositive(murmur2(key)) % n`."""
    cdef Py_ssize_t n = len(keys), i, p
    if len(values) != n:
        raise ValueError("as many keys as values")
    if partitions <= 0:
        raise ValueError(f"partitions must be positive, got {partitions}")
    cdef list out_keys = [[] for _ in range(partitions)]
    cdef list out_values = [[] for _ in range(partitions)]
    cdef unsigned long long h
    for i in range(n):
        k = keys[i]
        h = murmurhash2(k, SEED)
        p = <Py_ssize_t>((h & 0x7FFFFFFF) % <unsigned long long>partitions)
        (<list>out_keys[p]).append(k)
        (<list>out_values[p]).append(values[i])
    return list(zip(out_keys, out_values))


cdef inline bint span(const unsigned char *offs, Py_ssize_t r, Py_ssize_t data_len,
                      Py_ssize_t *a, Py_ssize_t *b) noexcept nogil:
    """Row r's [a, b) in its column's data from the int32 offsets (unaligned reads); False when
    the offsets run backwards or outside the data."""
    cdef int x, y
    memcpy(&x, offs + r * 4, 4)
    memcpy(&y, offs + r * 4 + 4, 4)
    a[0] = x
    b[0] = y
    return 0 <= x <= y and y <= data_len


def encode_columns(object first_offset, object timestamp_ms, Py_ssize_t n, list pieces):
    """`codec_arrow.encode_columns_python`'s (lines, sizes) for n records, or None (not sure).

    pieces[0] is the key, the concatenation of pieces[1:] the value; each is bytes (the same for
    every record) or an Arrow binary array's (offsets buffer, data buffer, the array's offset):
    row r's bytes are data[offsets[offset + r]:offsets[offset + r + 1]]. None when a buffer is
    short, an offset runs backwards or outside its data, a number is too wide, or the lines would
    pass 2 GiB (the reference's int32 offsets)."""
    cdef long long first, ts
    try:
        first = first_offset
        ts = timestamp_ms
    except OverflowError:
        return None
    cdef Py_ssize_t m = len(pieces), i, j, a, b, kl, vl, bound = 0, ts_len, start
    if n == 0:
        return b"", []
    if n < 0 or m < 1 or first < 0 or first > LLONG_MAX - n:
        return None
    cdef list keep = []  # the buffers' views, alive while their pointers are used
    cdef const signed char[::1] offs_view  # pyarrow's buffers export signed bytes ('b')
    cdef const signed char[::1] data_view
    cdef const char **data = <const char **>malloc(m * sizeof(char *))
    cdef const unsigned char **offs = <const unsigned char **>malloc(m * sizeof(char *))
    cdef Py_ssize_t *size = <Py_ssize_t *>malloc(m * sizeof(Py_ssize_t))  # a constant's length, or a column's data length
    cdef char *buf = NULL
    cdef char *d
    cdef char *line
    cdef list sizes
    try:
        if data == NULL or offs == NULL or size == NULL:
            raise MemoryError()
        for j in range(m):
            piece = pieces[j]
            if type(piece) is bytes:
                data[j] = <bytes>piece
                offs[j] = NULL
                size[j] = len(<bytes>piece)
                continue
            if type(piece) is not tuple or len(<tuple>piece) != 3:
                return None
            try:
                offs_view = piece[0]
                data_view = piece[1]
                start = piece[2]
            except (TypeError, ValueError, BufferError, OverflowError):
                return None  # not pyarrow buffers, or an offset no array has
            keep.append((offs_view, data_view))
            if start < 0 or offs_view.shape[0] // 4 - 1 - start < n:
                return None  # the offsets do not cover n rows from `start`
            offs[j] = <const unsigned char *>&offs_view[0] + start * 4
            size[j] = data_view.shape[0]
            data[j] = L_HEADERS  # any valid address: nothing is read from an empty column
            if size[j]:
                data[j] = <const char *>&data_view[0]
        ts_len = (1 if ts < 0 else 0) + u64_len(<unsigned long long>0 - <unsigned long long>ts if ts < 0 else ts)
        for i in range(n):
            kl = 0
            vl = 0
            for j in range(m):
                if offs[j] == NULL:
                    a, b = 0, size[j]
                elif not span(offs[j], i, size[j], &a, &b):
                    return None
                if j == 0:
                    kl = b - a
                else:
                    vl += b - a
            bound += LINE_FIXED + u64_len(first + i) + ts_len + u64_len(kl) + u64_len(vl) + 10 + kl + vl
            if bound > 0x7FFFFFFF:
                return None
        buf = <char *>malloc(bound)
        if buf == NULL:
            raise MemoryError()
        d = buf
        sizes = [0] * n
        for i in range(n):
            line = d
            kl = 0
            vl = 0
            for j in range(m):
                if offs[j] == NULL:
                    a, b = 0, size[j]
                else:
                    span(offs[j], i, size[j], &a, &b)
                if j == 0:
                    kl = b - a
                else:
                    vl += b - a
            d = put(d, L_OFFSET, 10)
            d = put_u64(d, first + i)
            d = put(d, L_TS, 13)
            d = put_i64(d, ts)
            d = put(d, L_LENS, 9)
            d = put_u64(d, kl)
            d[0] = b','
            d = put_u64(d + 1, vl)
            d = put(d, L_KEY, 10)
            for j in range(m):
                if j == 1:
                    d = put(d, L_VALUE, 9)
                if offs[j] == NULL:
                    d = put(d, data[j], size[j])
                else:
                    span(offs[j], i, size[j], &a, &b)
                    d = put(d, data[j] + a, b - a)
            if m == 1:
                d = put(d, L_VALUE, 9)
            d = close_line(line, d)
            sizes[i] = d - line
        return buf[: d - buf], sizes
    finally:
        free(data)
        free(offs)
        free(size)
        free(buf)


cdef inline Py_ssize_t take_digits(const unsigned char *d, Py_ssize_t p, Py_ssize_t end, long long *out) noexcept nogil:
    """The non-negative decimal at d[p:] (at most 18 digits); the position after it, or -1."""
    cdef Py_ssize_t start = p
    cdef long long v = 0
    while p < end and 48 <= d[p] <= 57 and p - start < 18:
        v = v * 10 + (d[p] - 48)
        p += 1
    if p == start or (p < end and 48 <= d[p] <= 57):
        return -1
    out[0] = v
    return p


cdef inline bint has(const unsigned char *d, Py_ssize_t p, Py_ssize_t end, const char *lit, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    if p + n > end:
        return False
    for i in range(n):
        if d[p + i] != <unsigned char>lit[i]:
            return False
    return True


cdef Py_ssize_t _key_spans(
    const unsigned char *d, Py_ssize_t end, Py_ssize_t cap,
    long long *offs, long long *ks, long long *ke, unsigned char *tomb
) noexcept nogil:
    cdef Py_ssize_t p = 0, line, n = 0, q
    cdef long long off, prev = -1, ts, kl, vl, hl, stored
    cdef Py_ssize_t k0, v0, h0, h1
    while p < end:
        if n >= cap:
            return -1
        line = p
        if not has(d, p, end, L_OFFSET, 10):
            return -1
        p = take_digits(d, p + 10, end, &off)
        if p < 0 or off <= prev or not has(d, p, end, L_TS, 13):
            return -1
        p += 13
        if p < end and d[p] == 45:  # '-'
            p += 1
        p = take_digits(d, p, end, &ts)
        if p < 0 or not has(d, p, end, L_LENS, 9):
            return -1
        p = take_digits(d, p + 9, end, &kl)
        if p < 0 or not has(d, p, end, b',', 1):
            return -1
        p = take_digits(d, p + 1, end, &vl)
        if p < 0 or not has(d, p, end, b',', 1):
            return -1
        p = take_digits(d, p + 1, end, &hl)
        if p < 0 or not has(d, p, end, b'],"key":', 8):
            return -1
        k0 = p + 8
        v0 = k0 + kl + 9
        h0 = v0 + vl + 11
        h1 = h0 + hl
        if h1 + 7 > end or not has(d, k0 + kl, end, L_VALUE, 9) or not has(d, v0 + vl, end, b',"headers":', 11):
            return -1
        if not has(d, h1, end, L_CRC, 7):
            return -1
        q = take_digits(d, h1 + 7, end, &stored)
        if q < 0 or not has(d, q, end, b'}\n', 2):
            return -1
        if <long long>crc32(0, d + line, <unsigned int>(h1 - line)) != stored:
            return -1
        if kl == 4 and has(d, k0, end, b'null', 4):
            ks[n] = -1
            ke[n] = -1
        else:
            ks[n] = k0
            ke[n] = k0 + kl
        tomb[n] = vl == 4 and has(d, v0, end, b'null', 4)
        offs[n] = off
        prev = off
        n += 1
        p = q + 2
    return n


def key_spans(
    const unsigned char[::1] data, long long[::1] offs, long long[::1] ks, long long[::1] ke, unsigned char[::1] tomb
):
    """Each line's offset, its key span [ks, ke) in `data` (-1, -1 for a null key) and whether
    its value is JSON null (a tombstone): what `live_keys` needs of a record, without decoding its value.
    Every line is checked as `codec.decode_line` checks it (its layout, ascending offsets, its CRC).
    Returns the number of lines, or -1 when a line is not an intact record or there are more
    lines than `ks` holds: the caller then takes the decoding path, which says what is wrong."""
    cdef Py_ssize_t cap = min(offs.shape[0], ks.shape[0], ke.shape[0], tomb.shape[0])
    cdef Py_ssize_t n
    if data.shape[0] == 0:
        return 0
    if cap == 0:
        return -1
    with nogil:
        n = _key_spans(&data[0], data.shape[0], cap, &offs[0], &ks[0], &ke[0], &tomb[0])
    return n
