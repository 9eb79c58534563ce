/* capture._speedups: the per-change hot path of streamed INSERTs and the columnar snapshot, in C.
 *
 * Each function is the compiled twin of a pure-Python reference that stays the fallback:
 *
 *   encode_inserts(spec, payloads, value_tail)  ~ insert_template.InsertTemplate.encode_many_python
 *   split_partitions(keys, values, partitions)  ~ log.partitioner.split_partitions_python
 *   encode_plain(first_offset, timestamp_ms, keys, values)  ~ log.codec.encode_plain_python
 *   encode_columns(first_offset, timestamp_ms, n, pieces)  ~ log.codec_arrow.encode_columns_python
 *   take_inserts(get_copy_data, run, room)  ~ the receive loop + SourceSession.handle for held INSERTs
 *   take_copy(get_copy_data, buf, limit)  ~ snapshot.take_copy_python (the columnar snapshot's COPY)
 *   column_partitions(offsets, data, start, out, partitions)  ~ snapshot_columns.murmur2_partitions_python
 *   risky_bytes(data)  ~ snapshot_columns.risky_bytes_python
 *
 * Each answers None whenever it is not sure to give the reference's very bytes (an odd shape,
 * a value rule that declines, a NUL or a newline inside a field, a number too wide for 64 bits):
 * the caller then runs the Python reference, so the output is always the reference's. Data never
 * raises here; a malformed `spec` (a programming error) raises TypeError/ValueError.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <zlib.h>

/* ---------------------------------------------------------------------------------------------
 * small byte helpers
 */

static const char SPLIT[] = ",\"value\":";
#define SPLIT_LEN ((Py_ssize_t)(sizeof(SPLIT) - 1))
static const char INSERT_HEAD[] = "{\"action\":\"I\",";
#define INSERT_HEAD_LEN ((Py_ssize_t)(sizeof(INSERT_HEAD) - 1))
static const char LSN_KEY[] = ",\"lsn\":";
#define LSN_KEY_LEN ((Py_ssize_t)(sizeof(LSN_KEY) - 1))

static int
is_null(const char *t, Py_ssize_t n)
{
    return n == 4 && memcmp(t, "null", 4) == 0;
}

static int
ends_with(const char *t, Py_ssize_t n, const char *suffix, Py_ssize_t k)
{
    return n >= k && memcmp(t + n - k, suffix, (size_t)k) == 0;
}

/* Index of the first `c` in t[0:n], or -1 (bytes.find of one byte). */
static Py_ssize_t
find_byte(const char *t, Py_ssize_t n, char c)
{
    const char *p = n > 0 ? memchr(t, c, (size_t)n) : NULL;
    return p == NULL ? -1 : (Py_ssize_t)(p - t);
}

/* The first `needle` (k bytes) in t[0:n], or NULL: memchr for needle[anchor], a byte chosen to
 * be rare in the haystack, then one compare. (glibc's memmem sets up tables on every call: too
 * slow for short haystacks searched millions of times.) Leftmost, as bytes.find. */
static const char *
find_sub(const char *t, Py_ssize_t n, const char *needle, Py_ssize_t k, Py_ssize_t anchor)
{
    const char *p = t + anchor, *last = t + n - k + anchor; /* needle[anchor]'s last possible place */
    while (n >= k && p <= last) {
        p = memchr(p, needle[anchor], (size_t)(last - p + 1));
        if (p == NULL)
            return NULL;
        if (memcmp(p - anchor, needle, (size_t)k) == 0)
            return p - anchor;
        p++;
    }
    return NULL;
}

static int
contains(const char *t, Py_ssize_t n, const char *needle, Py_ssize_t k)
{
    return find_sub(t, n, needle, k, 0) != NULL;
}

/* `,"value":` is found by its `v`: rare in a document (no other key has one) */
static const char *
find_split(const char *t, Py_ssize_t n)
{
    return find_sub(t, n, SPLIT, SPLIT_LEN, 2);
}

/* Decimal digits of v, written backwards from `end`; returns the first digit's address. */
static char *
put_u64_back(char *end, uint64_t v)
{
    do {
        *--end = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    return end;
}

static Py_ssize_t
u64_len(uint64_t v)
{
    Py_ssize_t n = 1;
    while (v >= 10) {
        v /= 10;
        n++;
    }
    return n;
}

static char *
put_u64(char *d, uint64_t v)
{
    char tmp[24];
    char *s = put_u64_back(tmp + sizeof(tmp), v);
    size_t n = (size_t)(tmp + sizeof(tmp) - s);
    memcpy(d, s, n);
    return d + n;
}

static uint64_t
magnitude(long long v)
{
    return v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
}

static Py_ssize_t
i64_len(long long v)
{
    return (v < 0 ? 1 : 0) + u64_len(magnitude(v));
}

static char *
put_i64(char *d, long long v)
{
    if (v < 0)
        *d++ = '-';
    return put_u64(d, magnitude(v));
}

static char *
put(char *d, const char *s, Py_ssize_t n)
{
    memcpy(d, s, (size_t)n);
    return d + n;
}

#define PUT_LIT(d, lit) put((d), (lit), (Py_ssize_t)(sizeof(lit) - 1))

/* 1 to 8 hex digits → value; -1 for anything else (the caller declines). */
static long long
hex32(const char *t, Py_ssize_t n)
{
    if (n < 1 || n > 8)
        return -1;
    long long v = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        char c = t[i];
        int d;
        if (c >= '0' && c <= '9')
            d = c - '0';
        else if (c >= 'a' && c <= 'f')
            d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            d = c - 'A' + 10;
        else
            return -1;
        v = v * 16 + d;
    }
    return v;
}

/* ---------------------------------------------------------------------------------------------
 * encode_inserts
 *
 * spec = (ends, rules, tag_len, key_at, key_pieces, value_pieces), built once per template:
 *   ends[j]         the constant end of column j's piece after its value token
 *   rules[j]        0 as printed (int, bool), 1 numeric, 2 timestamptz, 3 timestamp, 4 bytea,
 *                   5 text-like, or a callable token -> bytes | None (the generic rule)
 *   tag_len         the length of the table tag ending every head
 *   key_at          the key's columns, in key order
 *   key_pieces      len(key_at) + 1 constant pieces around the key's tokens
 *   value_pieces    len(ends) + 1 constant pieces around the value's tokens (the last one ends
 *                   with the source's `"lsn":`)
 * The value is value_pieces interleaved with the tokens, the LSN in decimal, then value_tail.
 */

enum { R_PASS = 0, R_NUMERIC, R_TSTZ, R_TS, R_BYTEA, R_TEXT, R_CALL };

typedef struct {
    Py_ssize_t m;                 /* columns */
    const char **end;             /* [m] */
    Py_ssize_t *end_len;          /* [m] */
    int *rule;                    /* [m] */
    PyObject **call;              /* [m] borrowed, only for R_CALL */
    Py_ssize_t tag_len;
    Py_ssize_t nkey;
    Py_ssize_t *key_at;           /* [nkey] */
    const char **kp;              /* [nkey + 1] */
    Py_ssize_t *kp_len;
    const char **vp;              /* [m + 1] */
    Py_ssize_t *vp_len;
    Py_ssize_t key_fixed, value_fixed;  /* the pieces' total lengths */
    void *block;                  /* one allocation for all of the above arrays */
} Spec;

static void
spec_free(Spec *s)
{
    PyMem_Free(s->block);
    s->block = NULL;
}

static int
bytes_items(PyObject *tuple, const char *what, Py_ssize_t want, const char **ptr, Py_ssize_t *len)
{
    if (!PyTuple_Check(tuple) || PyTuple_GET_SIZE(tuple) != want) {
        PyErr_Format(PyExc_TypeError, "spec: %s must be a tuple of %zd bytes", what, want);
        return -1;
    }
    for (Py_ssize_t i = 0; i < want; i++) {
        PyObject *b = PyTuple_GET_ITEM(tuple, i);
        if (!PyBytes_Check(b)) {
            PyErr_Format(PyExc_TypeError, "spec: %s must hold bytes", what);
            return -1;
        }
        ptr[i] = PyBytes_AS_STRING(b);
        len[i] = PyBytes_GET_SIZE(b);
    }
    return 0;
}

/* Unpack a spec tuple (borrowed references: the caller holds `obj` for the call). */
static int
spec_parse(PyObject *obj, Spec *s)
{
    memset(s, 0, sizeof(*s));
    if (!PyTuple_Check(obj) || PyTuple_GET_SIZE(obj) != 6) {
        PyErr_SetString(PyExc_TypeError, "spec must be a 6-tuple");
        return -1;
    }
    PyObject *ends = PyTuple_GET_ITEM(obj, 0), *rules = PyTuple_GET_ITEM(obj, 1);
    PyObject *tag = PyTuple_GET_ITEM(obj, 2), *key_at = PyTuple_GET_ITEM(obj, 3);
    PyObject *kps = PyTuple_GET_ITEM(obj, 4), *vps = PyTuple_GET_ITEM(obj, 5);
    if (!PyTuple_Check(ends) || !PyTuple_Check(rules) || !PyTuple_Check(key_at)) {
        PyErr_SetString(PyExc_TypeError, "spec: ends, rules and key_at must be tuples");
        return -1;
    }
    Py_ssize_t m = PyTuple_GET_SIZE(ends), nkey = PyTuple_GET_SIZE(key_at);
    if (m < 1 || PyTuple_GET_SIZE(rules) != m || nkey < 1) {
        PyErr_SetString(PyExc_ValueError, "spec: one rule per column and at least one key column");
        return -1;
    }
    s->tag_len = PyLong_AsSsize_t(tag);
    if (s->tag_len == -1 && PyErr_Occurred())
        return -1;
    if (s->tag_len < 1) {
        PyErr_SetString(PyExc_ValueError, "spec: tag_len must be positive");
        return -1;
    }
    /* one block: pointers first (aligned), then sizes, then ints */
    size_t nptr = (size_t)m + (size_t)m + (size_t)(nkey + 1) + (size_t)(m + 1);
    size_t nsize = (size_t)m + (size_t)nkey + (size_t)(nkey + 1) + (size_t)(m + 1);
    char *block = PyMem_Malloc(nptr * sizeof(void *) + nsize * sizeof(Py_ssize_t) + (size_t)m * sizeof(int));
    if (block == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    s->block = block;
    s->m = m;
    s->nkey = nkey;
    void **ptrs = (void **)block;
    s->end = (const char **)ptrs;
    s->call = (PyObject **)(ptrs + m);
    s->kp = (const char **)(ptrs + 2 * m);
    s->vp = (const char **)(ptrs + 2 * m + nkey + 1);
    Py_ssize_t *sizes = (Py_ssize_t *)(ptrs + nptr);
    s->end_len = sizes;
    s->key_at = sizes + m;
    s->kp_len = sizes + m + nkey;
    s->vp_len = sizes + m + nkey + nkey + 1;
    s->rule = (int *)(sizes + nsize);

    if (bytes_items(ends, "ends", m, s->end, s->end_len) < 0 ||
        bytes_items(kps, "key_pieces", nkey + 1, s->kp, s->kp_len) < 0 ||
        bytes_items(vps, "value_pieces", m + 1, s->vp, s->vp_len) < 0)
        goto fail;
    for (Py_ssize_t j = 0; j < m; j++) {
        if (s->end_len[j] < 1) {
            PyErr_SetString(PyExc_ValueError, "spec: a piece's end is never empty");
            goto fail;
        }
        PyObject *r = PyTuple_GET_ITEM(rules, j);
        s->call[j] = NULL;
        if (PyLong_Check(r)) {
            long code = PyLong_AsLong(r);
            if (code < R_PASS || code > R_TEXT) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_ValueError, "spec: unknown rule code");
                goto fail;
            }
            s->rule[j] = (int)code;
        }
        else if (PyCallable_Check(r)) {
            s->rule[j] = R_CALL;
            s->call[j] = r;
        }
        else {
            PyErr_SetString(PyExc_TypeError, "spec: a rule is an int code or a callable");
            goto fail;
        }
    }
    for (Py_ssize_t k = 0; k < nkey; k++) {
        Py_ssize_t at = PyLong_AsSsize_t(PyTuple_GET_ITEM(key_at, k));
        if (at == -1 && PyErr_Occurred())
            goto fail;
        if (at < 0 || at >= m) {
            PyErr_SetString(PyExc_ValueError, "spec: key_at out of range");
            goto fail;
        }
        s->key_at[k] = at;
    }
    for (Py_ssize_t k = 0; k <= nkey; k++)
        s->key_fixed += s->kp_len[k];
    for (Py_ssize_t j = 0; j <= m; j++)
        s->value_fixed += s->vp_len[j];
    return 0;
fail:
    spec_free(s);
    return -1;
}

/* One value token → its envelope spelling's length, or -1: not sure (the run declines). */
static Py_ssize_t
rule_len(int rule, const char *t, Py_ssize_t n)
{
    switch (rule) {
    case R_PASS:
        return n;
    case R_NUMERIC:
        /* "-0" would parse to the int 0; a quoted token or nothing is not a numeric we know */
        if (is_null(t, n))
            return 4;
        if (n == 0 || (n == 2 && t[0] == '-' && t[1] == '0') || t[0] == '"')
            return -1;
        return n + 2;
    case R_TSTZ:
        /* "YYYY-MM-DD hh:mm:ss[.f]+00" → "YYYY-MM-DDThh:mm:ss[.f]Z"; a second `+00"` (never
         * printed by PostgreSQL) would make the column-wise reference differ: decline */
        if (n >= 6 && t[5] == '-' && find_byte(t, n, ' ') == 11 && ends_with(t, n, "+00\"", 4))
            return contains(t, n - 1, "+00\"", 4) ? -1 : n - 2;
        return is_null(t, n) ? 4 : -1;
    case R_TS:
        if (n >= 6 && t[5] == '-' && find_byte(t, n, ' ') == 11 && !ends_with(t, n, " BC\"", 4))
            return n;
        return is_null(t, n) ? 4 : -1;
    case R_BYTEA:
        if (is_null(t, n) || (n >= 1 && t[0] == '"' && find_byte(t, n, '\\') < 0))
            return n;
        return -1;
    case R_TEXT:
        if (((n >= 1 && t[0] == '"') || (n >= 4 && memcmp(t, "null", 4) == 0)) && !contains(t, n, "\\u", 2))
            return n;
        return -1;
    }
    return -1;
}

/* Write what rule_len measured. */
static char *
rule_put(char *d, int rule, const char *t, Py_ssize_t n)
{
    if (is_null(t, n) && (rule == R_NUMERIC || rule == R_TSTZ || rule == R_TS))
        return PUT_LIT(d, "null");
    switch (rule) {
    case R_NUMERIC:
        *d++ = '"';
        d = put(d, t, n);
        *d++ = '"';
        return d;
    case R_TSTZ:
        d = put(d, t, 11);
        *d++ = 'T';
        d = put(d, t + 12, n - 16);
        return PUT_LIT(d, "Z\"");
    case R_TS:
        d = put(d, t, n);
        d[11 - n] = 'T';
        return d;
    default:
        return put(d, t, n);
    }
}

typedef struct {
    Py_ssize_t start, len;  /* the token within its payload */
    Py_ssize_t out_len;     /* its envelope spelling's length */
} Tok;

static PyObject *
encode_inserts(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "encode_inserts(spec, payloads, value_tail)");
        return NULL;
    }
    if (!PyList_Check(args[1]) || !PyBytes_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "encode_inserts: payloads is a list, value_tail bytes");
        return NULL;
    }
    Spec s;
    if (spec_parse(args[0], &s) < 0)
        return NULL;
    /* A tuple of the payloads: a generic rule's Python code cannot free one under us. */
    PyObject *docs = PyList_AsTuple(args[1]);
    Tok *toks = NULL;
    PyObject **gen = NULL;
    uint64_t *lsns = NULL;
    PyObject *keys = NULL, *values = NULL, *result = NULL;
    if (docs == NULL)
        goto done;
    const Py_ssize_t n = PyTuple_GET_SIZE(docs), m = s.m;
    const char *tail = PyBytes_AS_STRING(args[2]);
    const Py_ssize_t tail_len = PyBytes_GET_SIZE(args[2]);
    if (n == 0 || n > PY_SSIZE_T_MAX / (Py_ssize_t)sizeof(Tok) / m)
        goto decline;
    toks = PyMem_Malloc((size_t)(n * m) * sizeof(Tok));
    lsns = PyMem_Malloc((size_t)n * sizeof(uint64_t));
    if (toks == NULL || lsns == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t j = 0; j < m; j++) {
        if (s.rule[j] == R_CALL) {
            gen = PyMem_Calloc((size_t)(n * m), sizeof(PyObject *));
            if (gen == NULL) {
                PyErr_NoMemory();
                goto done;
            }
            break;
        }
    }

    /* 1. split each document at `,"value":` (exactly m times) and check every constant end */
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *doc = PyTuple_GET_ITEM(docs, i);
        if (!PyBytes_Check(doc))
            goto decline;
        const char *b = PyBytes_AS_STRING(doc);
        const Py_ssize_t len = PyBytes_GET_SIZE(doc);
        const char *p = find_split(b, len);
        if (p == NULL)
            goto decline;
        for (Py_ssize_t j = 0; j < m; j++) {
            Py_ssize_t start = (p - b) + SPLIT_LEN;
            const char *q = find_split(b + start, len - start);
            if ((q == NULL) != (j == m - 1))
                goto decline; /* fewer or more pieces than the template's */
            Py_ssize_t stop = q == NULL ? len : q - b;
            if (!ends_with(b + start, stop - start, s.end[j], s.end_len[j]))
                goto decline;
            Tok *t = &toks[i * m + j];
            t->start = start;
            t->len = stop - start - s.end_len[j];
            p = q;
        }
    }

    /* 2. each column's rule over every token */
    for (Py_ssize_t j = 0; j < m; j++) {
        const int rule = s.rule[j];
        for (Py_ssize_t i = 0; i < n; i++) {
            Tok *t = &toks[i * m + j];
            const char *tb = PyBytes_AS_STRING(PyTuple_GET_ITEM(docs, i)) + t->start;
            if (rule == R_CALL) {
                PyObject *arg = PyBytes_FromStringAndSize(tb, t->len);
                if (arg == NULL)
                    goto done;
                PyObject *got = PyObject_CallOneArg(s.call[j], arg);
                Py_DECREF(arg);
                if (got == NULL)
                    goto done;
                if (!PyBytes_Check(got)) {
                    Py_DECREF(got);
                    goto decline;
                }
                gen[i * m + j] = got;
                t->out_len = PyBytes_GET_SIZE(got);
            }
            else if ((t->out_len = rule_len(rule, tb, t->len)) < 0)
                goto decline;
        }
    }

    /* 3. the heads: the same up to the LSN's text (`{"action":"I",…,"lsn":"`), then `X/Y"` */
    {
        PyObject *d0 = PyTuple_GET_ITEM(docs, 0);
        const char *h0 = PyBytes_AS_STRING(d0);
        Py_ssize_t h0_len = toks[0].start - SPLIT_LEN - s.tag_len;
        if (h0_len <= 0)
            goto decline;
        const char *quote = memrchr(h0, '"', (size_t)h0_len);
        if (quote == NULL)
            goto decline;
        const Py_ssize_t pre = quote - h0, prefix = pre + 1;
        if (pre < INSERT_HEAD_LEN || memcmp(h0, INSERT_HEAD, INSERT_HEAD_LEN) != 0 ||
            !ends_with(h0, pre, LSN_KEY, LSN_KEY_LEN))
            goto decline;
        for (Py_ssize_t i = 0; i < n; i++) {
            const char *h = PyBytes_AS_STRING(PyTuple_GET_ITEM(docs, i));
            const Py_ssize_t h_len = toks[i * m].start - SPLIT_LEN;
            if (h_len < prefix || memcmp(h, h0, (size_t)prefix) != 0)
                goto decline;
            const Py_ssize_t lsn_len = h_len - s.tag_len - prefix;
            const char *lsn = h + prefix;
            Py_ssize_t slash = lsn_len > 0 ? find_byte(lsn, lsn_len, '/') : -1;
            if (slash < 0)
                goto decline;
            long long hi = hex32(lsn, slash), lo = hex32(lsn + slash + 1, lsn_len - slash - 1);
            if (hi < 0 || lo < 0)
                goto decline;
            lsns[i] = ((uint64_t)hi << 32) | (uint64_t)lo;
        }
    }

    /* 4. keys and values, each written straight into a bytes object of its exact size */
    keys = PyList_New(n);
    values = PyList_New(n);
    if (keys == NULL || values == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *b = PyBytes_AS_STRING(PyTuple_GET_ITEM(docs, i));
        Tok *row = &toks[i * m];
        PyObject **grow = gen == NULL ? NULL : &gen[i * m];
        Py_ssize_t klen = s.key_fixed, vlen = s.value_fixed + u64_len(lsns[i]) + tail_len;
        for (Py_ssize_t k = 0; k < s.nkey; k++)
            klen += row[s.key_at[k]].out_len;
        for (Py_ssize_t j = 0; j < m; j++)
            vlen += row[j].out_len;
        PyObject *key = PyBytes_FromStringAndSize(NULL, klen);
        if (key == NULL)
            goto done;
        PyList_SET_ITEM(keys, i, key);
        PyObject *value = PyBytes_FromStringAndSize(NULL, vlen);
        if (value == NULL)
            goto done;
        PyList_SET_ITEM(values, i, value);

        char *d = PyBytes_AS_STRING(key);
        for (Py_ssize_t k = 0; k < s.nkey; k++) {
            Py_ssize_t j = s.key_at[k];
            d = put(d, s.kp[k], s.kp_len[k]);
            if (grow != NULL && grow[j] != NULL)
                d = put(d, PyBytes_AS_STRING(grow[j]), row[j].out_len);
            else
                d = rule_put(d, s.rule[j], b + row[j].start, row[j].len);
        }
        d = put(d, s.kp[s.nkey], s.kp_len[s.nkey]);
        assert(d == PyBytes_AS_STRING(key) + klen);

        d = PyBytes_AS_STRING(value);
        for (Py_ssize_t j = 0; j < m; j++) {
            d = put(d, s.vp[j], s.vp_len[j]);
            if (grow != NULL && grow[j] != NULL)
                d = put(d, PyBytes_AS_STRING(grow[j]), row[j].out_len);
            else
                d = rule_put(d, s.rule[j], b + row[j].start, row[j].len);
        }
        d = put(d, s.vp[m], s.vp_len[m]);
        d = put_u64(d, lsns[i]);
        d = put(d, tail, tail_len);
        assert(d == PyBytes_AS_STRING(value) + vlen);
    }
    result = PyTuple_Pack(2, keys, values);
    goto done;

decline:
    result = Py_NewRef(Py_None);
done:
    if (gen != NULL) {
        for (Py_ssize_t i = 0; docs != NULL && i < PyTuple_GET_SIZE(docs) * s.m; i++)
            Py_XDECREF(gen[i]);
        PyMem_Free(gen);
    }
    PyMem_Free(toks);
    PyMem_Free(lsns);
    Py_XDECREF(keys);
    Py_XDECREF(values);
    Py_XDECREF(docs);
    spec_free(&s);
    return result;
}

/* ---------------------------------------------------------------------------------------------
 * encode_plain: segment lines for records with one timestamp, no headers, no null key or value
 *
 *   {"offset":O,"timestamp":T,"lens":[K,V,4],"key":…,"value":…,"headers":null,"crc":C}\n
 * with C = zlib.crc32 of everything before `,"crc":`. Returns (data, sizes) or None.
 */

static const char L_OFFSET[] = "{\"offset\":";
static const char L_TS[] = ",\"timestamp\":";
static const char L_LENS[] = ",\"lens\":[";
static const char L_KEY[] = ",4],\"key\":";
static const char L_VALUE[] = ",\"value\":";
static const char L_HEADERS[] = ",\"headers\":null";
static const char L_CRC[] = ",\"crc\":";
#define LIT_LEN(lit) ((Py_ssize_t)(sizeof(lit) - 1))
#define LINE_FIXED                                                                                 \
    (LIT_LEN(L_OFFSET) + LIT_LEN(L_TS) + LIT_LEN(L_LENS) + 1 + LIT_LEN(L_KEY) + LIT_LEN(L_VALUE) + \
     LIT_LEN(L_HEADERS) + LIT_LEN(L_CRC) + 2)

static uLong
crc32_of(const char *p, Py_ssize_t n)
{
    return crc32_z(0L, (const Bytef *)p, (z_size_t)n);
}

/* A line's bytes up to its key: `{"offset":O,"timestamp":T,"lens":[K,V,4],"key":`. */
static char *
line_head(char *d, uint64_t offset, long long ts, Py_ssize_t kl, Py_ssize_t vl)
{
    d = PUT_LIT(d, L_OFFSET);
    d = put_u64(d, offset);
    d = PUT_LIT(d, L_TS);
    d = put_i64(d, ts);
    d = PUT_LIT(d, L_LENS);
    d = put_u64(d, (uint64_t)kl);
    *d++ = ',';
    d = put_u64(d, (uint64_t)vl);
    return PUT_LIT(d, L_KEY);
}

/* The line begun at `line`, its value written up to `d`: `,"headers":null,"crc":C}\n`. */
static char *
line_tail(const char *line, char *d)
{
    d = PUT_LIT(d, L_HEADERS);
    uLong crc = crc32_of(line, d - line);
    d = PUT_LIT(d, L_CRC);
    d = put_u64(d, (uint64_t)crc);
    *d++ = '}';
    *d++ = '\n';
    return d;
}

/* A line's size at most (its CRC at 10 digits) for this offset, timestamp width and key/value sizes. */
static Py_ssize_t
line_bound(uint64_t offset, Py_ssize_t ts_len, Py_ssize_t kl, Py_ssize_t vl)
{
    return LINE_FIXED + u64_len(offset) + ts_len + u64_len((uint64_t)kl) + u64_len((uint64_t)vl) + 10;
}

/* The first offset and the timestamp of a batch of lines: 1, 0 (too wide: decline) or -1 (error). */
static int
offset_and_ts(PyObject *first_obj, PyObject *ts_obj, long long *first, long long *ts)
{
    int overflow = 0;
    *first = PyLong_AsLongLongAndOverflow(first_obj, &overflow);
    if (*first == -1 && PyErr_Occurred())
        return -1;
    if (overflow)
        return 0;
    *ts = PyLong_AsLongLongAndOverflow(ts_obj, &overflow);
    if (*ts == -1 && PyErr_Occurred())
        return -1;
    return !overflow;
}

/* (data, sizes) for the lines written into `*data` up to `end` (shrunk to fit); steals nothing. */
static PyObject *
lines_result(PyObject **data, PyObject *sizes, const char *end)
{
    if (_PyBytes_Resize(data, end - PyBytes_AS_STRING(*data)) < 0)
        return NULL; /* *data is NULL now */
    return PyTuple_Pack(2, *data, sizes);
}

/* 1 when the field may be spliced as is: no NUL (the reference's separator) and no newline */
static int
plain_field(PyObject *f)
{
    if (!PyBytes_Check(f))
        return 0;
    const char *b = PyBytes_AS_STRING(f);
    size_t n = (size_t)PyBytes_GET_SIZE(f);
    return memchr(b, '\0', n) == NULL && memchr(b, '\n', n) == NULL;
}

static PyObject *
encode_plain(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "encode_plain(first_offset, timestamp_ms, keys, values)");
        return NULL;
    }
    long long first, ts;
    int ok = offset_and_ts(args[0], args[1], &first, &ts);
    if (ok <= 0)
        return ok < 0 ? NULL : Py_NewRef(Py_None);
    /* tuples of the items: nothing a garbage collection runs while we allocate can free them */
    PyObject *ks = PySequence_Tuple(args[2]);
    if (ks == NULL)
        return NULL;
    PyObject *vs = PySequence_Tuple(args[3]);
    if (vs == NULL) {
        Py_DECREF(ks);
        return NULL;
    }
    PyObject *data = NULL, *sizes = NULL, *result = NULL;
    const Py_ssize_t n = PyTuple_GET_SIZE(ks);
    if (n != 0 && (PyTuple_GET_SIZE(vs) != n || first < 0 || first > LLONG_MAX - n))
        goto decline;
    PyObject **kv = &PyTuple_GET_ITEM(ks, 0), **vv = &PyTuple_GET_ITEM(vs, 0);
    const Py_ssize_t ts_len = i64_len(ts);
    /* an upper bound: every CRC at 10 digits */
    Py_ssize_t bound = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!plain_field(kv[i]) || !plain_field(vv[i]))
            goto decline;
        Py_ssize_t kl = PyBytes_GET_SIZE(kv[i]), vl = PyBytes_GET_SIZE(vv[i]);
        Py_ssize_t line = line_bound((uint64_t)(first + i), ts_len, kl, vl);
        if (kl > PY_SSIZE_T_MAX / 4 - line || vl > PY_SSIZE_T_MAX / 4 - line - kl ||
            bound > PY_SSIZE_T_MAX / 2 - line - kl - vl)
            goto decline;
        bound += line + kl + vl;
    }
    data = PyBytes_FromStringAndSize(NULL, bound);
    sizes = PyList_New(n);
    if (data == NULL || sizes == NULL)
        goto done;
    char *const base = PyBytes_AS_STRING(data);
    char *d = base;
    for (Py_ssize_t i = 0; i < n; i++) {
        char *line = d;
        Py_ssize_t kl = PyBytes_GET_SIZE(kv[i]), vl = PyBytes_GET_SIZE(vv[i]);
        d = line_head(d, (uint64_t)(first + i), ts, kl, vl);
        d = put(d, PyBytes_AS_STRING(kv[i]), kl);
        d = PUT_LIT(d, L_VALUE);
        d = put(d, PyBytes_AS_STRING(vv[i]), vl);
        d = line_tail(line, d);
        PyObject *size = PyLong_FromSsize_t(d - line);
        if (size == NULL)
            goto done;
        PyList_SET_ITEM(sizes, i, size);
    }
    assert(d - base <= bound);
    result = lines_result(&data, sizes, d);
    goto done;
decline:
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(data);
    Py_XDECREF(sizes);
    Py_DECREF(ks);
    Py_DECREF(vs);
    return result;
}

/* ---------------------------------------------------------------------------------------------
 * encode_columns: codec_arrow.encode_columns_python's segment lines, from Arrow binary columns
 *
 *   encode_columns(first_offset, timestamp_ms, n, pieces) -> (data, sizes) | None
 *
 * n records; pieces[0] is the key, the concatenation of pieces[1:] the value. A piece is bytes
 * (the same for every record) or a column (offsets, data, start, rows): an Arrow binary array's
 * int32 offsets buffer and data buffer, the array's offset, and None or an int64 buffer of n row
 * numbers (record i is the array's row rows[i], as `take` would pick it; else row i). Row r's
 * bytes are data[offsets[start + r]:offsets[start + r + 1]]. Lines as encode_plain's:
 *   {"offset":O,"timestamp":T,"lens":[K,V,4],"key":…,"value":…,"headers":null,"crc":C}\n
 * None (the reference runs) when a buffer is short, an offset runs backwards or outside its data,
 * a row number is out of range, a number is too wide, or the data would pass 2 GiB (the
 * reference's int32 offsets).
 */

typedef struct {
    const char *bytes;        /* a constant piece: its bytes; NULL for a column */
    Py_ssize_t len;           /* the constant's length */
    const char *data;         /* a column: its data buffer */
    Py_ssize_t data_len;
    const unsigned char *offs; /* int32 offsets from the array's offset (unaligned reads) */
    Py_ssize_t rows_avail;    /* rows the offsets buffer describes from `start` */
    const unsigned char *rows; /* int64 row numbers, or NULL */
} ColPiece;

/* 1 when `view` (got with PyBUF_FORMAT) holds int64 items (`q`, or `l` on LP64; any byte order mark). */
static int
is_int64(const Py_buffer *view)
{
    const char *f = view->format;
    if (f != NULL && (*f == '<' || *f == '=' || *f == '@'))
        f++;
    return view->itemsize == 8 && f != NULL && (strcmp(f, "q") == 0 || strcmp(f, "l") == 0);
}

/* Record i's bytes of piece c; 0 when the buffers do not hold them (the call declines). */
static int
col_span(const ColPiece *c, Py_ssize_t i, const char **p, Py_ssize_t *len)
{
    if (c->bytes != NULL) {
        *p = c->bytes;
        *len = c->len;
        return 1;
    }
    int64_t r = i;
    if (c->rows != NULL)
        memcpy(&r, c->rows + (size_t)i * 8, 8);
    if (r < 0 || r >= c->rows_avail)
        return 0;
    int32_t a, b;
    memcpy(&a, c->offs + (size_t)r * 4, 4);
    memcpy(&b, c->offs + (size_t)r * 4 + 4, 4);
    if (a < 0 || b < a || b > c->data_len)
        return 0;
    *p = c->data + a;
    *len = (Py_ssize_t)b - a;
    return 1;
}

/* Fill `c` from one piece; 1 done, 0 decline, -1 error. `views` gets up to 3 buffers (their
 * count in *nviews) which the caller releases. */
static int
col_piece(PyObject *obj, Py_ssize_t n, ColPiece *c, Py_buffer *views, int *nviews)
{
    memset(c, 0, sizeof(*c));
    if (PyBytes_Check(obj)) {
        c->bytes = PyBytes_AS_STRING(obj);
        c->len = PyBytes_GET_SIZE(obj);
        return 1;
    }
    if (!PyTuple_Check(obj) || PyTuple_GET_SIZE(obj) != 4)
        return 0;
    PyObject *rows = PyTuple_GET_ITEM(obj, 3);
    Py_ssize_t start = PyLong_AsSsize_t(PyTuple_GET_ITEM(obj, 2));
    if (start == -1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError) && !PyErr_ExceptionMatches(PyExc_TypeError))
            return -1;
        PyErr_Clear();
        return 0;
    }
    if (start < 0)
        return 0;
    for (int k = 0; k < (rows == Py_None ? 2 : 3); k++) {
        int flags = k == 2 ? PyBUF_FORMAT | PyBUF_C_CONTIGUOUS : PyBUF_SIMPLE;
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(obj, k == 2 ? 3 : k), &views[k], flags) < 0) {
            if (!PyErr_ExceptionMatches(PyExc_TypeError) && !PyErr_ExceptionMatches(PyExc_BufferError))
                return -1;
            PyErr_Clear();
            return 0;
        }
        (*nviews)++;
    }
    Py_ssize_t words = views[0].len / 4; /* offsets in the buffer */
    if (start > words - 1)
        return 0;
    c->offs = (const unsigned char *)views[0].buf + (size_t)start * 4;
    c->rows_avail = words - 1 - start;
    c->data = (const char *)views[1].buf;
    c->data_len = views[1].len;
    if (rows != Py_None) {
        if (!is_int64(&views[2]) || views[2].len != n * 8)
            return 0; /* not int64 row numbers */
        c->rows = (const unsigned char *)views[2].buf;
    }
    else if (c->rows_avail < n)
        return 0;
    return 1;
}

#define MAX_ARROW_DATA ((Py_ssize_t)INT32_MAX)

static PyObject *
encode_columns(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "encode_columns(first_offset, timestamp_ms, n, pieces)");
        return NULL;
    }
    long long first, ts;
    int ok = offset_and_ts(args[0], args[1], &first, &ts);
    if (ok <= 0)
        return ok < 0 ? NULL : Py_NewRef(Py_None);
    Py_ssize_t n = PyLong_AsSsize_t(args[2]);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n < 0 || n > MAX_ARROW_DATA || (n > 0 && (first < 0 || first > LLONG_MAX - n)))
        Py_RETURN_NONE;
    /* a tuple of the pieces: it holds them (and so their buffers' owners) for the call */
    PyObject *ps = PySequence_Tuple(args[3]);
    if (ps == NULL)
        return NULL;
    const Py_ssize_t np_ = PyTuple_GET_SIZE(ps);
    PyObject *data = NULL, *sizes = NULL, *result = NULL;
    ColPiece *cols = NULL;
    Py_buffer *views = NULL;
    int nviews = 0;
    if (n == 0) { /* the reference answers (b"", []) */
        data = PyBytes_FromStringAndSize(NULL, 0);
        sizes = PyList_New(0);
        if (data != NULL && sizes != NULL)
            result = lines_result(&data, sizes, PyBytes_AS_STRING(data));
        goto done;
    }
    if (np_ < 1 || np_ > 100000)
        goto decline;
    cols = PyMem_Calloc((size_t)np_, sizeof(ColPiece));
    views = PyMem_Calloc((size_t)np_ * 3, sizeof(Py_buffer));
    if (cols == NULL || views == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t j = 0; j < np_; j++) {
        int got = 0;
        int ok = col_piece(PyTuple_GET_ITEM(ps, j), n, &cols[j], views + nviews, &got);
        nviews += got;
        if (ok < 0)
            goto done;
        if (ok == 0)
            goto decline;
    }
    /* pass 1: check every span, and bound the size (every CRC at 10 digits) */
    const Py_ssize_t ts_len = i64_len(ts);
    Py_ssize_t bound = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *p;
        Py_ssize_t kl, vl = 0, len;
        if (!col_span(&cols[0], i, &p, &kl))
            goto decline;
        if (kl > MAX_ARROW_DATA)
            goto decline;
        for (Py_ssize_t j = 1; j < np_; j++) {
            if (!col_span(&cols[j], i, &p, &len) || len > MAX_ARROW_DATA - vl)
                goto decline;
            vl += len;
        }
        bound += line_bound((uint64_t)(first + i), ts_len, kl, vl) + kl + vl;
        if (bound > MAX_ARROW_DATA)
            goto decline; /* the reference's joins might pass their int32 offsets */
    }
    data = PyBytes_FromStringAndSize(NULL, bound);
    sizes = PyList_New(n);
    if (data == NULL || sizes == NULL)
        goto done;
    char *const base = PyBytes_AS_STRING(data);
    char *d = base;
    for (Py_ssize_t i = 0; i < n; i++) {
        char *line = d;
        const char *key, *p;
        Py_ssize_t kl, vl = 0, len;
        (void)col_span(&cols[0], i, &key, &kl); /* checked in pass 1 */
        for (Py_ssize_t j = 1; j < np_; j++) {
            (void)col_span(&cols[j], i, &p, &len);
            vl += len;
        }
        d = line_head(d, (uint64_t)(first + i), ts, kl, vl);
        d = put(d, key, kl);
        d = PUT_LIT(d, L_VALUE);
        for (Py_ssize_t j = 1; j < np_; j++) {
            (void)col_span(&cols[j], i, &p, &len);
            d = put(d, p, len);
        }
        d = line_tail(line, d);
        PyObject *size = PyLong_FromSsize_t(d - line);
        if (size == NULL)
            goto done;
        PyList_SET_ITEM(sizes, i, size);
    }
    assert(d - base <= bound);
    result = lines_result(&data, sizes, d);
    goto done;
decline:
    result = Py_NewRef(Py_None);
done:
    for (int k = 0; k < nviews; k++)
        PyBuffer_Release(&views[k]);
    PyMem_Free(views);
    PyMem_Free(cols);
    Py_XDECREF(data);
    Py_XDECREF(sizes);
    Py_DECREF(ps);
    return result;
}

/* ---------------------------------------------------------------------------------------------
 * split_partitions: each partition's keys and values, in order, by Kafka's default partitioner
 * (murmur2 of the key, positive, mod the partition count), as `partitioner.split_partitions_python`.
 */

static uint32_t
murmur2(const unsigned char *data, Py_ssize_t length)
{
    const uint32_t m = 0x5bd1e995u;
    uint32_t h = 0x9747b28cu ^ (uint32_t)length;
    const Py_ssize_t end4 = length & ~(Py_ssize_t)3;
    for (Py_ssize_t i = 0; i < end4; i += 4) {
        uint32_t k = (uint32_t)data[i] | (uint32_t)data[i + 1] << 8 | (uint32_t)data[i + 2] << 16 |
                     (uint32_t)data[i + 3] << 24;
        k *= m;
        k ^= k >> 24;
        k *= m;
        h *= m;
        h ^= k;
    }
    switch (length & 3) {
    case 3:
        h ^= (uint32_t)data[end4 + 2] << 16;
        /* fall through */
    case 2:
        h ^= (uint32_t)data[end4 + 1] << 8;
        /* fall through */
    case 1:
        h ^= (uint32_t)data[end4];
        h *= m;
    }
    h ^= h >> 13;
    h *= m;
    h ^= h >> 15;
    return h;
}

static PyObject *
split_partitions(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "split_partitions(keys, values, partitions)");
        return NULL;
    }
    if (!PyList_Check(args[0]) || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "split_partitions: keys and values are lists");
        return NULL;
    }
    int overflow = 0;
    long count = PyLong_AsLongAndOverflow(args[2], &overflow);
    if (count == -1 && PyErr_Occurred())
        return NULL;
    const Py_ssize_t n = PyList_GET_SIZE(args[0]);
    if (overflow || count < 1 || count > 1 << 20 || PyList_GET_SIZE(args[1]) != n)
        Py_RETURN_NONE; /* the reference raises (or answers) for these */
    /* tuples of the items: nothing a garbage collection runs while we allocate can free them */
    PyObject *kt = PyList_AsTuple(args[0]), *vt = kt == NULL ? NULL : PyList_AsTuple(args[1]);
    PyObject *result = NULL;
    Py_ssize_t *sizes = NULL;
    uint32_t *part = NULL;
    if (vt == NULL || PyTuple_GET_SIZE(vt) != n || PyTuple_GET_SIZE(kt) != n) {
        if (vt != NULL)
            result = Py_NewRef(Py_None);
        goto done;
    }
    PyObject **ks = &PyTuple_GET_ITEM(kt, 0), **vs = &PyTuple_GET_ITEM(vt, 0);
    sizes = PyMem_Calloc((size_t)count, sizeof(Py_ssize_t));
    part = PyMem_Malloc((size_t)(n > 0 ? n : 1) * sizeof(uint32_t));
    if (sizes == NULL || part == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyBytes_Check(ks[i])) {
            result = Py_NewRef(Py_None);
            goto done;
        }
        uint32_t h = murmur2((const unsigned char *)PyBytes_AS_STRING(ks[i]), PyBytes_GET_SIZE(ks[i]));
        part[i] = (h & 0x7fffffffu) % (uint32_t)count;
        sizes[part[i]]++;
    }
    result = PyList_New(count);
    if (result == NULL)
        goto done;
    for (long p = 0; p < count; p++) {
        PyObject *pk = PyList_New(sizes[p]), *pv = pk == NULL ? NULL : PyList_New(sizes[p]);
        PyObject *pair = pv == NULL ? NULL : PyTuple_Pack(2, pk, pv);
        Py_XDECREF(pk);
        Py_XDECREF(pv);
        if (pair == NULL) {
            Py_CLEAR(result);
            goto done;
        }
        PyList_SET_ITEM(result, p, pair);
        sizes[p] = 0; /* from here on: how many placed */
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *pair = PyList_GET_ITEM(result, part[i]);
        Py_ssize_t at = sizes[part[i]]++;
        PyList_SET_ITEM(PyTuple_GET_ITEM(pair, 0), at, Py_NewRef(ks[i]));
        PyList_SET_ITEM(PyTuple_GET_ITEM(pair, 1), at, Py_NewRef(vs[i]));
    }
done:
    PyMem_Free(sizes);
    PyMem_Free(part);
    Py_XDECREF(kt);
    Py_XDECREF(vt);
    return result;
}

/* ---------------------------------------------------------------------------------------------
 * the columnar snapshot's per-chunk scans
 *
 * column_partitions(offsets, data, start, out, partitions) ~ snapshot_columns.murmur2_partitions_python:
 *   Kafka's partition of every key of an Arrow binary array (int32 offsets buffer, data buffer,
 *   the array's offset) into `out`, a writable int64 buffer of one slot per key. True, or None
 *   (a short buffer, an offset outside the data, `out` not int64, partitions outside 1..2**31-1).
 * risky_bytes(data) ~ snapshot_columns.risky_bytes_python: does `data` hold a byte below 0x20
 *   or the two bytes `\v`?
 */

static PyObject *
column_partitions(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "column_partitions(offsets, data, start, out, partitions)");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[2]);
    if (start == -1 && PyErr_Occurred())
        return NULL;
    long partitions = PyLong_AsLong(args[4]);
    if (partitions == -1 && PyErr_Occurred())
        return NULL;
    if (start < 0 || partitions < 1 || partitions > INT32_MAX)
        Py_RETURN_NONE;
    Py_buffer offs, data, out;
    if (PyObject_GetBuffer(args[0], &offs, PyBUF_SIMPLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[1], &data, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&offs);
        return NULL;
    }
    if (PyObject_GetBuffer(args[3], &out, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&offs);
        PyBuffer_Release(&data);
        return NULL;
    }
    PyObject *result = Py_None;
    const Py_ssize_t n = out.len / 8;
    if (!is_int64(&out))
        goto done; /* not int64 */
    if (start > offs.len / 4 - 1 || n > offs.len / 4 - 1 - start)
        goto done; /* the offsets do not cover n keys */
    const unsigned char *o = (const unsigned char *)offs.buf + (size_t)start * 4;
    const unsigned char *d = (const unsigned char *)data.buf;
    unsigned char *w = (unsigned char *)out.buf;
    int32_t a, b;
    for (Py_ssize_t i = 0; i < n; i++) { /* check all first: `out` is left as it was on None */
        memcpy(&a, o + (size_t)i * 4, 4);
        memcpy(&b, o + (size_t)i * 4 + 4, 4);
        if (a < 0 || b < a || b > data.len)
            goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        memcpy(&a, o + (size_t)i * 4, 4);
        memcpy(&b, o + (size_t)i * 4 + 4, 4);
        int64_t p = (int64_t)((murmur2(d + a, (Py_ssize_t)b - a) & 0x7fffffffu) % (uint32_t)partitions);
        memcpy(w + (size_t)i * 8, &p, 8);
    }
    result = Py_True;
done:
    PyBuffer_Release(&offs);
    PyBuffer_Release(&data);
    PyBuffer_Release(&out);
    return Py_NewRef(result);
}

static PyObject *
risky_bytes(PyObject *Py_UNUSED(module), PyObject *arg)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *s = view.buf;
    const Py_ssize_t n = view.len;
    int hit = 0;
    /* bytes below 0x20, eight at a time: a word has one when (w - 0x20…) & ~w & 0x80… != 0 */
    const uint64_t ones = 0x0101010101010101u, highs = 0x8080808080808080u;
    Py_ssize_t i = 0;
    for (; i + 8 <= n && !hit; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        hit = ((w - ones * 0x20) & ~w & highs) != 0;
    }
    for (; i < n && !hit; i++)
        hit = s[i] < 0x20;
    /* then `\v`: memchr for each backslash */
    for (const unsigned char *p = s, *end = s + n; !hit && p < end; p++) {
        p = memchr(p, '\\', (size_t)(end - p));
        if (p == NULL)
            break;
        hit = p + 1 < end && p[1] == 'v';
    }
    PyBuffer_Release(&view);
    return Py_NewRef(hit ? Py_True : Py_False);
}

/* ---------------------------------------------------------------------------------------------
 * take_inserts: the receive loop for a held run of INSERTs, without a Python object per message
 *
 * take_inserts(get_copy_data, run, room) calls `get_copy_data(1)` (psycopg's non-blocking
 * PQgetCopyData) and appends each XLogData payload that is an INSERT (`payload[11:12] == b"I"`, as
 * SourceSession.handle checks) to `run`, at most `room` of them. Returns None when it took `room`
 * or nothing is buffered (the caller compares len(run)); anything else it received, it returns
 * untouched as get_copy_data's (n, data) for the caller's usual path.
 */

#define XLOG_HEADER 25 /* 'w', dataStart, walEnd, sendTime */

static PyObject *
take_inserts(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "take_inserts(get_copy_data, run: list, room)");
        return NULL;
    }
    PyObject *get = args[0], *run = args[1];
    Py_ssize_t room = PyLong_AsSsize_t(args[2]);
    if (room == -1 && PyErr_Occurred())
        return NULL;
    PyObject *one = PyLong_FromLong(1);
    if (one == NULL)
        return NULL;
    PyObject *result = NULL;
    for (Py_ssize_t taken = 0; taken < room;) {
        PyObject *got = PyObject_CallOneArg(get, one);
        if (got == NULL)
            goto done;
        if (!PyTuple_Check(got) || PyTuple_GET_SIZE(got) != 2) {
            PyErr_SetString(PyExc_TypeError, "get_copy_data must answer (n, data)");
            Py_DECREF(got);
            goto done;
        }
        if (!PyLong_Check(PyTuple_GET_ITEM(got, 0))) {
            result = got;
            goto done;
        }
        int overflow = 0;
        long n = PyLong_AsLongAndOverflow(PyTuple_GET_ITEM(got, 0), &overflow);
        if (n == 0 && !overflow) { /* nothing buffered */
            Py_DECREF(got);
            break;
        }
        Py_buffer view;
        if (n < 0 || overflow || PyObject_GetBuffer(PyTuple_GET_ITEM(got, 1), &view, PyBUF_SIMPLE) < 0) {
            PyErr_Clear(); /* not a buffer: the caller's path says what it is */
            result = got;
            goto done;
        }
        const char *b = view.buf;
        if (view.len < XLOG_HEADER + 12 || b[0] != 'w' || b[XLOG_HEADER + 11] != 'I') {
            PyBuffer_Release(&view);
            result = got;
            goto done;
        }
        PyObject *payload = PyBytes_FromStringAndSize(b + XLOG_HEADER, view.len - XLOG_HEADER);
        PyBuffer_Release(&view);
        Py_DECREF(got); /* frees libpq's buffer */
        if (payload == NULL)
            goto done;
        int rc = PyList_Append(run, payload);
        Py_DECREF(payload);
        if (rc < 0)
            goto done;
        taken++;
    }
    result = Py_NewRef(Py_None);
done:
    Py_DECREF(one);
    return result;
}

/* ---------------------------------------------------------------------------------------------
 * take_copy: the columnar snapshot's COPY OUT loop, rows from libpq straight into one buffer
 *
 * take_copy(get_copy_data, buf, limit) ~ snapshot.take_copy_python: calls `get_copy_data(1)`
 * (psycopg's non-blocking PQgetCopyData) and appends each row's bytes to the bytearray `buf`
 * while it is shorter than `limit`. Returns 1 when `buf` reached `limit`, else get_copy_data's
 * first non-positive n, untouched (0: nothing buffered, -1: the COPY ended, -2: it failed).
 */

static PyObject *
take_copy(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyByteArray_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "take_copy(get_copy_data, buf: bytearray, limit)");
        return NULL;
    }
    PyObject *get = args[0], *buf = args[1];
    Py_ssize_t limit = PyLong_AsSsize_t(args[2]);
    if (limit == -1 && PyErr_Occurred())
        return NULL;
    PyObject *one = PyLong_FromLong(1);
    if (one == NULL)
        return NULL;
    PyObject *result = NULL;
    while (PyByteArray_GET_SIZE(buf) < limit) {
        PyObject *got = PyObject_CallOneArg(get, one);
        if (got == NULL)
            goto done;
        if (!PyTuple_Check(got) || PyTuple_GET_SIZE(got) != 2 || !PyLong_Check(PyTuple_GET_ITEM(got, 0))) {
            PyErr_SetString(PyExc_TypeError, "get_copy_data must answer (n: int, data)");
            Py_DECREF(got);
            goto done;
        }
        int overflow = 0;
        long n = PyLong_AsLongAndOverflow(PyTuple_GET_ITEM(got, 0), &overflow);
        if (overflow < 0 || (overflow == 0 && n <= 0)) {
            result = Py_NewRef(PyTuple_GET_ITEM(got, 0));
            Py_DECREF(got);
            goto done;
        }
        Py_buffer view;
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(got, 1), &view, PyBUF_SIMPLE) < 0) {
            Py_DECREF(got);
            goto done;
        }
        Py_ssize_t size = PyByteArray_GET_SIZE(buf);
        int rc = -1;
        if (view.len > PY_SSIZE_T_MAX - size)
            PyErr_NoMemory();
        else if ((rc = PyByteArray_Resize(buf, size + view.len)) == 0)
            memcpy(PyByteArray_AS_STRING(buf) + size, view.buf, (size_t)view.len);
        PyBuffer_Release(&view);
        Py_DECREF(got); /* frees libpq's buffer */
        if (rc < 0)
            goto done;
    }
    result = PyLong_FromLong(1);
done:
    Py_DECREF(one);
    return result;
}

/* ---------------------------------------------------------------------------------------------
 * module
 */

static PyMethodDef methods[] = {
    {"encode_inserts", (PyCFunction)(void (*)(void))encode_inserts, METH_FASTCALL,
     "encode_inserts(spec, payloads, value_tail) -> (keys, values) | None: "
     "InsertTemplate.encode_many's bytes for a run of one table's INSERTs, or None (not sure)."},
    {"encode_plain", (PyCFunction)(void (*)(void))encode_plain, METH_FASTCALL,
     "encode_plain(first_offset, timestamp_ms, keys, values) -> (data, sizes) | None: "
     "codec.encode_plain's lines and sizes, or None (a NUL or newline in a field, a too-wide number)."},
    {"encode_columns", (PyCFunction)(void (*)(void))encode_columns, METH_FASTCALL,
     "encode_columns(first_offset, timestamp_ms, n, pieces) -> (data, sizes) | None: "
     "codec_arrow.encode_columns_python's lines and sizes from Arrow binary columns, or None (not sure)."},
    {"split_partitions", (PyCFunction)(void (*)(void))split_partitions, METH_FASTCALL,
     "split_partitions(keys, values, partitions) -> [(keys, values), ...] | None: each partition's "
     "records in order, by Kafka's murmur2 partitioner; None when a key is not bytes."},
    {"take_copy", (PyCFunction)(void (*)(void))take_copy, METH_FASTCALL,
     "take_copy(get_copy_data, buf, limit) -> int: COPY rows from libpq onto the bytearray `buf` "
     "until it holds `limit` bytes (1) or get_copy_data answers n <= 0 (that n)."},
    {"column_partitions", (PyCFunction)(void (*)(void))column_partitions, METH_FASTCALL,
     "column_partitions(offsets, data, start, out, partitions) -> True | None: Kafka's partition "
     "of every key of an Arrow binary array into the int64 buffer `out`, or None (not sure)."},
    {"risky_bytes", (PyCFunction)risky_bytes, METH_O,
     "risky_bytes(data) -> bool: a byte below 0x20, or the two bytes \\v, in `data`."},
    {"take_inserts", (PyCFunction)(void (*)(void))take_inserts, METH_FASTCALL,
     "take_inserts(get_copy_data, run, room) -> None | (n, data): held INSERT documents straight "
     "from libpq onto `run`; returns the first other message untouched, None when full or idle."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef_Slot slots[] = {
    {0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "capture._speedups",
    .m_doc = "The per-change hot path of streamed INSERTs in C; the pure-Python code is the reference.",
    .m_size = 0,
    .m_methods = methods,
    .m_slots = slots,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    return PyModuleDef_Init(&module);
}
