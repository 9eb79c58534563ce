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
