/* shipper._native: the C fast paths of the reading side, each the inner loop of a Python class
 * that stays the reference and runs alone when this module is not built:
 *   split_lines  LineSplitter.feed's loop over complete lines (shipper/tail/lines.py);
 *   splice       DocBuilder's JSON line -> bulk pair (shipper/parse/document.py), below.
 *
 * A pino line is already the document Elasticsearch wants, minus the fields enrichment adds.
 * When a line is a JSON object that this file can prove is valid (RFC 8259, strict UTF-8), has no
 * duplicate key at any depth, none of the keys enrichment adds (`@timestamp`, `log`, `host`, the
 * input's fields) and an integer epoch-ms `time`, its bytes are passed through unchanged: the
 * added fields are written in front, the line's own bytes after them. The ECS fields of pino,
 * OpenTelemetry and pino-http keys (shipper/parse/ecs.py) are among the added fields: their
 * values are copied from the line's bytes. Everything else (flags,
 * text, escapes in keys, integers past 64 bits, floats near overflow, surrogate escapes, nesting
 * past 64, a newline from a multiline join, no `time`, ...) goes to `fallback`, the Python path,
 * so whatever this file accepts is a subset of what orjson accepts, with the same meaning; the
 * Python path stays the reference (tests/unit/test_splice.py holds both to the re-serialised
 * documents).
 *
 * splice(events, out, head, prefix_for, inc, mid, host, tail, reserved, fallback, ms_min, ms_max, ecs) -> int
 *   events     list of (start, end, data, flags)
 *   out        list the bulk pairs are appended to, in event order
 *   head       bytes: the action's start (`{"create":{"_index":"x","_id":"`), or None:
 *   prefix_for callable(epoch second) -> that bytes, for an index named after the event time
 *   inc        the incarnation and "-"
 *   mid        `,"log":{"file":{"path":..},"offset":`
 *   host       `,"host":{"name":..` (open: host.hostname may follow)
 *   tail       the input's fields as `,"k":v` pairs, then ","
 *   reserved   tuple of top-level keys (UTF-8 bytes) that send a line to the fallback
 *   fallback   callable(event) -> bytes appended to `out` by it
 *   ms_min/max the range of `time` (epoch ms) taken here
 *   ecs        (mode, fixed roots): mode 0 off, 1 add (the ECS fields written in front; a line
 *              that has an ECS object they go in is the fallback's, which merges), 2 replace (the
 *              same, and the sources mapped are cut out of the line's bytes, with the objects
 *              that leaves empty: `members_t`); fixed
 *              roots: the R_x bits of ECS objects the input's fields write (in `tail`), taken as
 *              the line's own
 * Returns the number of bytes appended to `out`.
 *
 * The scan of a batch runs without the GIL (the bytes are immutable and `events` is owned by the
 * caller), so the spool thread's Python runs meanwhile on the other core.
 *
 * Bytes that any writer of a watched file controls reach the scan, so its cost is linear in the
 * line whatever the line holds: duplicate keys are found through a hash table whose probes are
 * capped (a crowded table hands the line over), numbers past MAX_NUMBER_BYTES are handed over,
 * and the range of `time` is clamped to years 1970..9999 (a 4-digit @timestamp year).
 *
 * Built with -DSHIPPER_SCAN_ONLY this file is the scan alone, without Python (fuzz/scan_fuzz.c);
 * with -DSHIPPER_NO_SIMD the string scan is the scalar loop only.
 */
#ifdef SHIPPER_SCAN_ONLY
#define _GNU_SOURCE            /* newlocale, strtod_l (Python.h defines it for the extension) */
#include <stddef.h>
typedef ptrdiff_t Py_ssize_t;
#else
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#endif
#include <limits.h>
#include <locale.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__) && !defined(SHIPPER_NO_SIMD)
#define USE_SSE2 1
#include <emmintrin.h>
#endif

#define MAX_DEPTH 64
#define MAX_KEYS 1024          /* keys of all the objects open at once */
#define MAX_RESERVED 64
#define KEY_BITS 12
#define KEY_SLOTS (1 << KEY_BITS)  /* the key table: 4x MAX_KEYS, linear probing at load <= 1/4 */
#define MAX_PROBES 16          /* slots one key may visit; more: crafted collisions, the fallback's */
/* Longer number tokens are the fallback's, which re-serialises them (at most 24 bytes): passed
 * through verbatim they could pass Elasticsearch's limit (Jackson's max number length, 1,000). */
#define MAX_NUMBER_BYTES 100
/* 10000-01-01T00:00:00Z in epoch ms: `time` at or past it has no 4-digit year */
#define MS_YEAR_10000 253402300800000LL

typedef struct {
    const unsigned char *p;
    Py_ssize_t n;
} span_t;

typedef struct {
    const unsigned char *p;
    Py_ssize_t n;
    uint32_t tag;              /* low bits of the key's hash, compared before the bytes */
    uint32_t slot;             /* where it sits in the table */
} keyent_t;

typedef struct {
    const unsigned char *s;    /* cursor */
    const unsigned char *e;    /* end of the line */
    keyent_t keys[MAX_KEYS];   /* a stack: the keys of the objects open, outermost first */
    int nkeys;
    uint16_t slots[KEY_SLOTS]; /* 0 or 1 + the index in keys; zeroed before the first line */
} parser_t;

/* The ECS fields (shipper/parse/ecs.py, the reference): each one's source in a pino line. */
enum {
    F_TRACE, F_SPAN, F_TRANSACTION, F_ERR_TYPE, F_ERR_MESSAGE, F_ERR_STACK, F_PID, F_HOSTNAME, F_NAME,
    F_REQ_ID, F_REQ_METHOD, F_REQ_URL, F_CLIENT_ADDRESS, F_CLIENT_PORT, F_USER_AGENT, F_STATUS, F_DURATION,
    NFIELDS
};
/* The top-level objects they go in (a bit each): a line that has one of those a field of its
 * own goes in is the fallback's, which merges (ecs.py's `apply_ecs`). */
enum {
    R_TRACE = 1 << 0, R_SPAN = 1 << 1, R_TRANSACTION = 1 << 2, R_ERROR = 1 << 3, R_PROCESS = 1 << 4,
    R_HOST = 1 << 5, R_SERVICE = 1 << 6, R_HTTP = 1 << 7, R_URL = 1 << 8, R_CLIENT = 1 << 9,
    R_USER_AGENT = 1 << 10, R_EVENT = 1 << 11
};
static const unsigned FIELD_ROOT[NFIELDS] = {
    R_TRACE, R_SPAN, R_TRANSACTION, R_ERROR, R_ERROR, R_ERROR, R_PROCESS, R_HOST, R_SERVICE,
    R_HTTP, R_HTTP, R_URL, R_CLIENT, R_CLIENT, R_USER_AGENT, R_HTTP, R_EVENT
};
#define NROOTS 12
_Static_assert(R_EVENT == 1 << (NROOTS - 1), "NROOTS: the R_x bits");
/* the F_x bits of the fields that go in each object, by its R_x bit's index (init_tables) */
static uint32_t root_fields[NROOTS];
#define MAX_CUTS 32            /* ranges cut from a line's body (replace): more is the fallback's */
#define ECS_OFF 0
#define ECS_ADD 1
#define ECS_REPLACE 2          /* the sources mapped are cut out of the line's bytes */

typedef struct {
    uint32_t at, n;            /* bytes [at, at + n) of the line */
} rel_t;

/* What the scan of one line found; ok == 0: the fallback takes it. */
typedef struct scan_s {
    int ok;
    int level;                 /* 10..60 or 0 */
    span_t level_str;          /* a non-empty string level, raw, quotes included */
    span_t msg;                /* raw value of `msg` to copy into `message`, or n == 0 */
    long long time_ms;
    Py_ssize_t body_end;       /* index just past the top object's closing brace */
    uint32_t found;            /* bit F_x: the source of ECS field x, of the right type (only these
                                  entries of src are set) */
    rel_t src[NFIELDS];        /* its raw JSON value (a string with its quotes) */
    uint32_t url_q;            /* the '?' in req.url's span, 0: none */
    int req_id_is_int;         /* req.id is an integer: written as its text */
    long long req_id;
    long long duration_ns;     /* event.duration from responseTime */
    Py_ssize_t ecs_n;          /* the bytes write_ecs writes for it (sized in the scan, without the GIL) */
    int replace;               /* ecs: replace: the sources mapped are cut out of the body */
    int ncut;                  /* ranges of the line the body leaves out: sorted, disjoint (replace) */
    rel_t cut[MAX_CUTS];
    Py_ssize_t cut_n;          /* their bytes */
} scan_t;

/* the bytes of the ECS part of a pair (after host.name): defined with its writer below */
static Py_ssize_t ecs_size(const struct scan_s *S);

typedef struct {
    span_t keys[MAX_RESERVED];
    int n;
    long long ms_min, ms_max;
    int ecs;                   /* ECS_OFF, ECS_ADD or ECS_REPLACE */
    unsigned fixed_roots;      /* R_x bits of the ECS objects the input's fields write: a line with a
                                  field for one of them is the fallback's, which merges */
} rules_t;

/* The range of `time` the scan takes, within years 1970..9999 whatever the caller asks: fmt_ts
 * writes a 4-digit year, and a fifth digit would shift a tab, a newline or a quote into the
 * bulk body. */
static void set_time_range(rules_t *R, long long ms_min, long long ms_max) {
    R->ms_min = ms_min < 0 ? 0 : ms_min > MS_YEAR_10000 ? MS_YEAR_10000 : ms_min;
    R->ms_max = ms_max > MS_YEAR_10000 ? MS_YEAR_10000 : ms_max < R->ms_min ? R->ms_min : ms_max;
}

/* 1: byte needs a closer look inside a string ('"', '\\', < 0x20, >= 0x80) */
static unsigned char string_stop[256];

/* strtod in the "C" locale whatever the process's LC_NUMERIC (responseTime's '.'); (locale_t)0:
 * not made, and a line with a responseTime to map is the fallback's */
static locale_t c_numeric;

static void init_tables(void) {
    for (int c = 0; c < 256; c++)
        string_stop[c] = (c == '"' || c == '\\' || c < 0x20 || c >= 0x80);
    for (int f = 0; f < NFIELDS; f++)
        for (int r = 0; r < NROOTS; r++)
            if (FIELD_ROOT[f] >> r & 1)
                root_fields[r] |= 1u << f;
    if (c_numeric == (locale_t)0)
        c_numeric = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
}

static inline void skip_ws(parser_t *P) {
    /* no '\n': a newline inside an event (a multiline join) must not reach the bulk body raw */
    const unsigned char *s = P->s, *e = P->e;
    while (s < e && (*s == ' ' || *s == '\t' || *s == '\r'))
        s++;
    P->s = s;
}

static inline int hexval(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* A string at P->s (on its '"'). Sets *escaped when it holds a backslash escape. */
static int parse_string(parser_t *P, int *escaped) {
    const unsigned char *s = P->s + 1, *e = P->e;
    *escaped = 0;
    for (;;) {
#ifdef USE_SSE2
        /* 16 bytes at a time: '"', '\\', and (as signed bytes below 0x20) controls and non-ASCII */
        const __m128i quote = _mm_set1_epi8('"'), bslash = _mm_set1_epi8('\\'), space = _mm_set1_epi8(0x20);
        while (e - s >= 16) {
            __m128i v = _mm_loadu_si128((const __m128i *)s);
            __m128i hit = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, bslash)),
                                       _mm_cmplt_epi8(v, space));
            int mask = _mm_movemask_epi8(hit);
            if (mask) {
                s += __builtin_ctz((unsigned)mask);
                break;
            }
            s += 16;
        }
#endif
        while (s < e && !string_stop[*s])
            s++;
        if (s >= e)
            return 0;
        unsigned char c = *s;
        if (c == '"') {
            P->s = s + 1;
            return 1;
        }
        if (c == '\\') {
            *escaped = 1;
            if (s + 1 >= e)
                return 0;
            switch (s[1]) {
            case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't':
                s += 2;
                continue;
            case 'u': {
                if (s + 6 > e)
                    return 0;
                int cp = 0;
                for (int i = 2; i < 6; i++) {
                    int h = hexval(s[i]);
                    if (h < 0)
                        return 0;
                    cp = (cp << 4) | h;
                }
                if (cp >= 0xD800 && cp <= 0xDFFF)
                    return 0;  /* surrogate escapes: pairs and lone halves are the fallback's */
                s += 6;
                continue;
            }
            default:
                return 0;
            }
        }
        if (c < 0x20)
            return 0;
        /* strict UTF-8: no overlong forms, no surrogates, nothing past U+10FFFF */
        if (c >= 0xC2 && c <= 0xDF) {
            if (s + 1 >= e || (s[1] & 0xC0) != 0x80) return 0;
            s += 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            if (s + 2 >= e) return 0;
            unsigned char c1 = s[1];
            if (c == 0xE0 ? (c1 < 0xA0 || c1 > 0xBF)
                : c == 0xED ? (c1 < 0x80 || c1 > 0x9F)
                : (c1 & 0xC0) != 0x80) return 0;
            if ((s[2] & 0xC0) != 0x80) return 0;
            s += 3;
        } else if (c >= 0xF0 && c <= 0xF4) {
            if (s + 3 >= e) return 0;
            unsigned char c1 = s[1];
            if (c == 0xF0 ? (c1 < 0x90 || c1 > 0xBF)
                : c == 0xF4 ? (c1 < 0x80 || c1 > 0x8F)
                : (c1 & 0xC0) != 0x80) return 0;
            if ((s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80) return 0;
            s += 4;
        } else {
            return 0;
        }
    }
}

/* A number at P->s that orjson reads with the same meaning: an integer within int64/uint64
 * (orjson turns larger ones into floats), or a float far from overflowing a double (orjson
 * refuses infinity). *is_int and *value describe integers within long long (-2**63 included); larger ones get
 * *is_int = 0, which only means "not a pino time or level" to the callers. */
static int parse_number(parser_t *P, int *is_int, long long *value) {
    /* the scan stops one byte past MAX_NUMBER_BYTES: a token that reaches that end is too long
     * (handed over below, or refused where it was cut), and a shorter one reads as if unbounded */
    const unsigned char *s = P->s, *e = P->e - P->s > MAX_NUMBER_BYTES ? P->s + MAX_NUMBER_BYTES + 1 : P->e;
    int neg = 0, has_frac = 0, overflow = 0;
    Py_ssize_t int_digits = 0;     /* <= MAX_NUMBER_BYTES; never an int that a long run could wrap */
    uint64_t v = 0;
    if (s < e && *s == '-') {
        neg = 1;
        s++;
    }
    if (s >= e)
        return 0;
    if (*s == '0') {
        s++;
    } else if (*s >= '1' && *s <= '9') {
        while (s < e && *s >= '0' && *s <= '9') {
            unsigned d = (unsigned)(*s - '0');
            if (int_digits < 19)           /* below 10**19 < 2**64: no overflow possible */
                v = v * 10 + d;
            else if (v > (UINT64_MAX - d) / 10)
                overflow = 1;
            else
                v = v * 10 + d;
            int_digits++;
            s++;
        }
    } else {
        return 0;
    }
    if (s < e && *s == '.') {
        has_frac = 1;
        s++;
        if (s >= e || *s < '0' || *s > '9')
            return 0;
        while (s < e && *s >= '0' && *s <= '9')
            s++;
    }
    long long exp10 = 0;
    int has_exp = 0;
    if (s < e && (*s == 'e' || *s == 'E')) {
        has_exp = 1;
        s++;
        int eneg = 0, edigits = 0;
        if (s < e && (*s == '+' || *s == '-')) {
            eneg = *s == '-';
            s++;
        }
        if (s >= e || *s < '0' || *s > '9')
            return 0;
        while (s < e && *s >= '0' && *s <= '9') {
            if (++edigits > 4)
                return 0;  /* an exponent past 9999: the fallback decides */
            exp10 = exp10 * 10 + (*s - '0');
            s++;
        }
        if (eneg)
            exp10 = -exp10;
    }
    if (s - P->s > MAX_NUMBER_BYTES)
        return 0;
    if (has_frac || has_exp) {
        if ((long long)int_digits + exp10 > 300)
            return 0;  /* near or past DBL_MAX: orjson may refuse it as infinity */
        *is_int = 0;
    } else {
        if (overflow || (neg && v > (uint64_t)INT64_MAX + 1))
            return 0;  /* past int64/uint64: orjson reads a float */
        *is_int = v <= (uint64_t)INT64_MAX || neg;   /* -2**63 too */
        *value = !*is_int ? 0 : !neg ? (long long)v : v > (uint64_t)INT64_MAX ? LLONG_MIN : -(long long)v;
    }
    P->s = s;
    return 1;
}

static int parse_value(parser_t *P, int depth);

static int literal(parser_t *P, const char *word, Py_ssize_t n) {
    if (P->e - P->s < n || memcmp(P->s, word, (size_t)n) != 0)
        return 0;
    P->s += n;
    return 1;
}

/* The key table: the keys of the objects open at once, found by hash. A fixed hash is enough:
 * an input crafted to collide only fills MAX_PROBES slots, and the line goes to the fallback.
 * Whole-word loads only: a key's last bytes are read as one word that overlaps the one before
 * (or, under 8 bytes, as two overlapping 4-byte halves, or three bytes). A tail copied byte by
 * byte into a word on the stack and read back at once stalled store forwarding: that one load
 * was 37% of take_key, itself 8% of a backlog's CPU (perf annotate). */
static inline uint64_t key_mix(uint64_t h, uint64_t w) {
    h = (h ^ w) * 0x9E3779B97F4A7C15ull;
    return h ^ (h >> 29);
}

static inline uint64_t key_hash(const unsigned char *k, Py_ssize_t n) {
    uint64_t h = 0x243F6A8885A308D3ull ^ (uint64_t)n, w;
    if (n >= 8) {
        const unsigned char *end = k + n;
        for (; end - k > 8; k += 8) {
            memcpy(&w, k, 8);
            h = key_mix(h, w);
        }
        memcpy(&w, end - 8, 8);
        h = key_mix(h, w);
    } else if (n >= 4) {
        uint32_t a, b;
        memcpy(&a, k, 4);
        memcpy(&b, k + n - 4, 4);
        h = key_mix(h, (uint64_t)a | (uint64_t)b << 32);
    } else if (n > 0) {
        h = key_mix(h, (uint64_t)k[0] | (uint64_t)k[n >> 1] << 8 | (uint64_t)k[n - 1] << 16);
    }
    h *= 0xBF58476D1CE4E5B9ull;
    return h ^ (h >> 32);
}

/* Drop keys[base..] from the table, newest first: with linear probing that leaves the table
 * exactly as it was before they were put in. */
static inline void pop_keys(parser_t *P, int base) {
    for (int i = P->nkeys - 1; i >= base; i--)
        P->slots[P->keys[i].slot] = 0;
    P->nkeys = base;
}

/* A member's key at P->s and the ':' after it. The key is unescaped (an escaped key may equal
 * another spelled plainly: the fallback's) and none of keys[base..] (a duplicate: Elasticsearch
 * refuses it, orjson keeps the last); it is pushed onto keys. Leaves P->s on the value. */
static int take_key(parser_t *P, int base, const unsigned char **key, Py_ssize_t *key_n) {
    int escaped;
    skip_ws(P);
    if (P->s >= P->e || *P->s != '"')
        return 0;
    const unsigned char *k = P->s + 1;
    if (!parse_string(P, &escaped) || escaped)
        return 0;
    Py_ssize_t kn = P->s - 1 - k;
    if (P->nkeys >= MAX_KEYS)
        return 0;
    uint64_t h = key_hash(k, kn);
    uint32_t tag = (uint32_t)h, slot = (uint32_t)(h >> (64 - KEY_BITS));
    for (int probe = 1;; probe++) {
        int at = P->slots[slot];
        if (at == 0)
            break;
        const keyent_t *o = &P->keys[at - 1];
        if (at - 1 >= base && o->tag == tag && o->n == kn && memcmp(o->p, k, (size_t)kn) == 0)
            return 0;  /* a duplicate in this object (keys below base are the enclosing objects') */
        if (probe >= MAX_PROBES)
            return 0;
        slot = (slot + 1) & (KEY_SLOTS - 1);
    }
    keyent_t *ke = &P->keys[P->nkeys];
    ke->p = k;
    ke->n = kn;
    ke->tag = tag;
    ke->slot = slot;
    P->nkeys++;
    P->slots[slot] = (uint16_t)P->nkeys;
    skip_ws(P);
    if (P->s >= P->e || *P->s != ':')
        return 0;
    P->s++;
    skip_ws(P);
    *key = k;
    *key_n = kn;
    return 1;
}

/* After a member or element: 1 on ',' (another follows), 2 on `close` (consumed), 0 otherwise. */
static int after_item(parser_t *P, unsigned char close) {
    skip_ws(P);
    if (P->s >= P->e)
        return 0;
    if (*P->s == ',') {
        P->s++;
        return 1;
    }
    if (*P->s == close) {
        P->s++;
        return 2;
    }
    return 0;
}

static int take_members(parser_t *P, int depth, int kind, const unsigned char *data, struct scan_s *S);

/* An object at P->s (on its '{'); keys are checked for duplicates. */
static inline int parse_object(parser_t *P, int depth) {
    return take_members(P, depth, -1, NULL, NULL);
}

static int parse_array(parser_t *P, int depth) {
    if (depth > MAX_DEPTH)
        return 0;
    int more;
    P->s++;
    skip_ws(P);
    if (P->s < P->e && *P->s == ']') {
        P->s++;
        return 1;
    }
    do {
        skip_ws(P);
        if (!parse_value(P, depth + 1))
            return 0;
    } while ((more = after_item(P, ']')) == 1);
    return more == 2;
}

static int parse_value(parser_t *P, int depth) {
    if (P->s >= P->e)
        return 0;
    int escaped, is_int;
    long long v;
    switch (*P->s) {
    case '{': return parse_object(P, depth);
    case '[': return parse_array(P, depth);
    case '"': return parse_string(P, &escaped);
    case 't': return literal(P, "true", 4);
    case 'f': return literal(P, "false", 5);
    case 'n': return literal(P, "null", 4);
    default: return parse_number(P, &is_int, &v);
    }
}

static inline int key_is(const unsigned char *k, Py_ssize_t kn, const char *name, Py_ssize_t n) {
    return kn == n && memcmp(k, name, (size_t)n) == 0;
}

/* ---------------------------------------------------------------- ECS sources
 *
 * With rules' ecs on, the scan notes where the source of each ECS field is (parse/ecs.py's
 * table: pino's `pid`, `hostname`, `name`, OpenTelemetry's `trace_id`..., the error serializer's
 * `err`, pino-http's `req`, `res`, `responseTime`) when its value has the type the field takes,
 * and which ECS objects the line has of its own (`http`, or a dotted `http.x` key). The writer
 * copies the raw values; ecs.py is the reference for every rule here. */

enum { K_ERR, K_REQ, K_HEADERS, K_RES };      /* the objects whose members are sources */

static inline void note(scan_t *S, int f, const unsigned char *data, const unsigned char *vs, const unsigned char *ve) {
    S->src[f].at = (uint32_t)(vs - data);
    S->src[f].n = (uint32_t)(ve - vs);
    S->found |= 1u << f;
}

/* A source that must be a string: noted when it is one; any other value is parsed and left. A
 * req.url with an escape is the fallback's (its split at '?' is on the decoded text). */
static int take_string(parser_t *P, int depth, int f, const unsigned char *data, scan_t *S) {
    const unsigned char *vs = P->s;
    int escaped;
    if (*vs != '"')
        return parse_value(P, depth);
    if (!parse_string(P, &escaped))
        return 0;
    if (f == F_REQ_URL) {
        if (escaped)
            return 0;
        const unsigned char *q = memchr(vs + 1, '?', (size_t)(P->s - vs - 2));
        S->url_q = q != NULL ? (uint32_t)(q - vs) : 0;
    }
    note(S, f, data, vs, P->s);
    return 1;
}

/* A source that must be an integer within 64 bits, signed (orjson reads larger ones too; a long
 * field takes none of them); req.id also a string. */
static int take_integer(parser_t *P, int depth, int f, const unsigned char *data, scan_t *S) {
    const unsigned char *vs = P->s;
    int is_int;
    long long v;
    if (f == F_REQ_ID && *vs == '"') {
        S->req_id_is_int = 0;
        return take_string(P, depth, f, data, S);
    }
    if (*vs != '-' && (*vs < '0' || *vs > '9'))
        return parse_value(P, depth);
    if (!parse_number(P, &is_int, &v))
        return 0;
    if (is_int) {
        note(S, f, data, vs, P->s);
        if (f == F_REQ_ID) {
            S->req_id_is_int = 1;
            S->req_id = v;
        }
    }
    return 1;
}

/* A number token (valid JSON) with at most 15 significant digits, up to 22 of them after the
 * point and no exponent (`112.784`, `3`: what pino-http writes) as the double strtod reads: the
 * digits as an integer and 10**k are both exact doubles, so their quotient is correctly rounded
 * (Clinger's fast path). 0: the token is not of that form (strtod reads it). */
static int exact_double(const unsigned char *s, const unsigned char *e, double *out) {
    static const double POW10[23] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12,
                                     1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
    int neg = *s == '-', digits = 0, frac = -1;
    uint64_t m = 0;
    for (s += neg; s < e; s++) {
        if (*s == '.') {
            frac = 0;
            continue;
        }
        if (*s < '0' || *s > '9')
            return 0;                      /* an exponent */
        if (m || *s != '0')
            digits++;
        if (digits > 15)
            return 0;
        m = m * 10 + (uint64_t)(*s - '0');
        if (frac >= 0 && ++frac > 22)
            return 0;
    }
    double x = (double)m / POW10[frac > 0 ? frac : 0];
    *out = neg ? -x : x;
    return 1;
}

/* responseTime (ms, any JSON number) -> event.duration in integer ns: the double ms * 1e6 rounded
 * half to even, when a long holds it. */
static int take_duration(parser_t *P, int depth, const unsigned char *data, scan_t *S) {
    const unsigned char *vs = P->s;
    int is_int;
    long long v;
    char buf[MAX_NUMBER_BYTES + 1];
    if (*vs != '-' && (*vs < '0' || *vs > '9'))
        return parse_value(P, depth);
    if (!parse_number(P, &is_int, &v))
        return 0;
    double ms;
    if (!exact_double(vs, P->s, &ms)) {
        if (c_numeric == (locale_t)0)
            return 0;
        size_t n = (size_t)(P->s - vs);      /* <= MAX_NUMBER_BYTES: parse_number's bound */
        memcpy(buf, vs, n);
        buf[n] = 0;
        ms = strtod_l(buf, NULL, c_numeric);
    }
    double ns = ms * 1e6;
    if (ns >= -9223372036854775808.0 && ns < 9223372036854775808.0) {
        S->duration_ns = (long long)rint(ns);
        note(S, F_DURATION, data, vs, P->s);
    }
    return 1;
}

/* Which source a member of an ECS source object is (K_HEADERS: the object of req.headers), or -1. */
static int member_field(int kind, const unsigned char *k, Py_ssize_t kn) {
    switch (kind) {
    case K_ERR:
        if (key_is(k, kn, "type", 4)) return F_ERR_TYPE;
        if (key_is(k, kn, "message", 7)) return F_ERR_MESSAGE;
        if (key_is(k, kn, "stack", 5)) return F_ERR_STACK;
        return -1;
    case K_REQ:
        switch (kn) {
        case 2: return key_is(k, kn, "id", 2) ? F_REQ_ID : -1;
        case 3: return key_is(k, kn, "url", 3) ? F_REQ_URL : -1;
        case 6: return key_is(k, kn, "method", 6) ? F_REQ_METHOD : -1;
        case 7: return key_is(k, kn, "headers", 7) ? NFIELDS : -1;
        case 10: return key_is(k, kn, "remotePort", 10) ? F_CLIENT_PORT : -1;
        case 13: return key_is(k, kn, "remoteAddress", 13) ? F_CLIENT_ADDRESS : -1;
        default: return -1;
        }
    case K_HEADERS:
        return key_is(k, kn, "user-agent", 10) ? F_USER_AGENT : -1;
    case K_RES:
        return key_is(k, kn, "statusCode", 10) ? F_STATUS : -1;
    default:
        return -1;
    }
}

static int take_source(parser_t *P, int depth, int f, const unsigned char *data, scan_t *S);

/* ecs: replace: which members of one object the body leaves out, decided member by member as the
 * scan goes. A member removed after a kept one is cut with the ',' before it; removed ones before
 * the first kept member are cut with the ',' after each; an object all of whose members are
 * removed is removed from its own parent (ecs.py: "an object left empty by that goes too"). */
typedef struct {
    Py_ssize_t last_kept_end;  /* -1: none kept yet */
    Py_ssize_t head_start;     /* where the removed members before the first kept one start; -1 */
    int kept, removed;
} members_t;

static inline int add_cut(scan_t *S, Py_ssize_t a, Py_ssize_t b) {
    if (S->ncut >= MAX_CUTS)
        return 0;
    S->cut[S->ncut].at = (uint32_t)a;
    S->cut[S->ncut].n = (uint32_t)(b - a);
    S->ncut++;
    return 1;
}

/* The member at [start, end) of the line is done, kept or removed; 0: too many cuts. */
static inline int member_done(members_t *m, scan_t *S, Py_ssize_t start, Py_ssize_t end, int removed) {
    if (removed) {
        m->removed++;
        if (m->last_kept_end >= 0)
            return add_cut(S, m->last_kept_end, end);
        if (m->head_start < 0)
            m->head_start = start;
        return 1;
    }
    m->kept++;
    if (m->head_start >= 0) {
        if (!add_cut(S, m->head_start, start))
            return 0;
        m->head_start = -1;
    }
    m->last_kept_end = end;
    return 1;
}

/* An object at P->s, on its '{', its keys checked for duplicates; of kind K_x (err, req,
 * req.headers, res), its members that are ECS sources noted; of kind -1 (parse_object), none.
 * 0: invalid; 1: done; 2: done, and with replace every member of it was removed. */
static int take_members(parser_t *P, int depth, int kind, const unsigned char *data, scan_t *S) {
    if (depth > MAX_DEPTH)
        return 0;
    int base = P->nkeys, more, track = kind >= 0 && S->replace;
    members_t m = {-1, -1, 0, 0};
    const unsigned char *k;
    Py_ssize_t kn;
    P->s++;
    skip_ws(P);
    if (P->s < P->e && *P->s == '}') {
        P->s++;
        return 1;
    }
    do {
        if (!take_key(P, base, &k, &kn) || P->s >= P->e)
            return 0;
        int f = kind < 0 ? -1 : member_field(kind, k, kn), removed = 0;
        uint32_t before = kind < 0 ? 0 : S->found;
        if (f == NFIELDS) {
            int r = *P->s == '{' ? take_members(P, depth + 1, K_HEADERS, data, S) : parse_value(P, depth + 1);
            if (!r)
                return 0;
            removed = r == 2;                  /* headers emptied (parse_value gives 1) */
        } else if (f >= 0) {
            if (!take_source(P, depth + 1, f, data, S))
                return 0;
            removed = S->found != before;
        } else if (!parse_value(P, depth + 1)) {
            return 0;
        }
        if (track && !member_done(&m, S, (k - 1) - data, P->s - data, removed))
            return 0;
    } while ((more = after_item(P, '}')) == 1);
    pop_keys(P, base);
    if (more != 2)
        return 0;
    return track && m.kept == 0 && m.removed > 0 ? 2 : 1;
}

static int take_source(parser_t *P, int depth, int f, const unsigned char *data, scan_t *S) {
    switch (f) {
    case F_PID: case F_CLIENT_PORT: case F_STATUS: case F_REQ_ID:
        return take_integer(P, depth, f, data, S);
    case F_DURATION:
        return take_duration(P, depth, data, S);
    default:
        return take_string(P, depth, f, data, S);
    }
}

/* A top-level key of a line: the source field it is (F_x; NFIELDS + K_x: an object holding
 * sources), or -1; *roots gets the bit of an ECS object it is, or is a dotted key of. */
#define TOP_OBJECT(kind) (NFIELDS + (kind))
static int top_key(const unsigned char *k, Py_ssize_t kn, unsigned *roots) {
    switch (kn) {
    case 3:
        if (key_is(k, kn, "pid", 3)) return F_PID;
        if (key_is(k, kn, "req", 3)) return TOP_OBJECT(K_REQ);
        if (key_is(k, kn, "res", 3)) return TOP_OBJECT(K_RES);
        if (key_is(k, kn, "err", 3)) return TOP_OBJECT(K_ERR);
        if (key_is(k, kn, "url", 3)) { *roots |= R_URL; return -1; }
        break;
    case 4:
        if (key_is(k, kn, "name", 4)) return F_NAME;
        if (key_is(k, kn, "http", 4)) { *roots |= R_HTTP; return -1; }
        if (key_is(k, kn, "span", 4)) { *roots |= R_SPAN; return -1; }
        if (key_is(k, kn, "host", 4)) { *roots |= R_HOST; return -1; }   /* reserved: a dotted key's head */
        break;
    case 5:
        if (key_is(k, kn, "trace", 5)) { *roots |= R_TRACE; return -1; }
        if (key_is(k, kn, "error", 5)) { *roots |= R_ERROR; return -1; }
        if (key_is(k, kn, "event", 5)) { *roots |= R_EVENT; return -1; }
        break;
    case 6:
        if (key_is(k, kn, "client", 6)) { *roots |= R_CLIENT; return -1; }
        break;
    case 7:
        if (key_is(k, kn, "span_id", 7)) return F_SPAN;
        if (key_is(k, kn, "process", 7)) { *roots |= R_PROCESS; return -1; }
        if (key_is(k, kn, "service", 7)) { *roots |= R_SERVICE; return -1; }
        break;
    case 8:
        if (key_is(k, kn, "hostname", 8)) return F_HOSTNAME;
        if (key_is(k, kn, "trace_id", 8)) return F_TRACE;
        break;
    case 10:
        if (key_is(k, kn, "user_agent", 10)) { *roots |= R_USER_AGENT; return -1; }
        break;
    case 11:
        if (key_is(k, kn, "transaction", 11)) { *roots |= R_TRANSACTION; return -1; }
        break;
    case 12:
        if (key_is(k, kn, "responseTime", 12)) return F_DURATION;
        break;
    case 14:
        if (key_is(k, kn, "transaction_id", 14)) return F_TRANSACTION;
        break;
    default:
        break;
    }
    /* a dotted key (`"http.request.method": ...`) is its head's object's, as Elasticsearch reads it */
    const unsigned char *dot = kn > 1 ? memchr(k, '.', (size_t)kn) : NULL;
    if (dot != NULL)
        (void)top_key(k, dot - k, roots);
    return -1;
}

/* The cuts in order, overlapping ones merged (a removed object's parent cut covers the cuts
 * made inside it), and their total; 0 when they are not inside the body (never: a check). */
static int sort_cuts(scan_t *S) {
    rel_t *c = S->cut;
    for (int i = 1; i < S->ncut; i++)
        for (int j = i; j > 0 && c[j - 1].at > c[j].at; j--) {
            rel_t t = c[j];
            c[j] = c[j - 1];
            c[j - 1] = t;
        }
    int n = 0;
    for (int i = 0; i < S->ncut; i++) {
        if (n && c[i].at <= c[n - 1].at + c[n - 1].n) {
            uint32_t end = c[i].at + c[i].n;
            if (end > c[n - 1].at + c[n - 1].n)
                c[n - 1].n = end - c[n - 1].at;
        } else {
            c[n++] = c[i];
        }
    }
    S->ncut = n;
    S->cut_n = 0;
    for (int i = 0; i < n; i++)
        S->cut_n += c[i].n;
    return n == 0 || (c[0].at >= 1 && (Py_ssize_t)(c[n - 1].at + c[n - 1].n) <= S->body_end - 1);
}

/* The top-level object of one line: validates all of it, notes time, level, msg, message. */
static void scan_line(parser_t *P, const unsigned char *data, Py_ssize_t len, const rules_t *R, scan_t *out) {
    out->ok = 0;
    out->found = 0;
    if (len < 2 || data[0] != '{' || (R->ecs && (uint64_t)len > UINT32_MAX))
        return;   /* (the ECS sources' offsets are 32-bit; no line is that long: max_line_bytes) */
    pop_keys(P, 0);   /* what a line handed over left in the table */
    P->s = data;
    P->e = data + len;
    int escaped, is_int, more, have_time = 0, has_message = 0, f;
    unsigned roots = 0;       /* the ECS objects the line has of its own */
    long long v;
    const unsigned char *k;
    Py_ssize_t kn;
    span_t msg = {NULL, 0};
    members_t top = {-1, -1, 0, 0};
    out->level = 0;
    out->level_str.n = 0;
    out->replace = R->ecs == ECS_REPLACE;
    out->ncut = 0;
    out->cut_n = 0;
    P->s++;
    skip_ws(P);
    if (P->s < P->e && *P->s == '}')
        return;  /* {}: nothing to splice onto; the fallback writes it */
    do {
        if (!take_key(P, 0, &k, &kn) || P->s >= P->e)
            return;
        for (int i = 0; i < R->n; i++)
            if (R->keys[i].n == kn && (kn == 0 || R->keys[i].p[0] == k[0]) && memcmp(R->keys[i].p, k, (size_t)kn) == 0)
                return;  /* a key shipper adds (or one of the input's fields): the fallback merges */
        const unsigned char *vs = P->s;
        int removed = 0;
        if (key_is(k, kn, "time", 4)) {
            if (*vs == '-' || (*vs >= '0' && *vs <= '9')) {
                if (!parse_number(P, &is_int, &v))
                    return;
                if (!is_int || v < R->ms_min || v >= R->ms_max)
                    return;  /* seconds, a float, out of range: the fallback's time rules */
                out->time_ms = v;
                have_time = 1;
            } else {
                return;  /* bunyan's ISO text, null, ...: the fallback parses it */
            }
        } else if (key_is(k, kn, "level", 5)) {
            if (*vs == '"') {
                if (!parse_string(P, &escaped))
                    return;
                if (P->s - vs > 2) {
                    out->level_str.p = vs;
                    out->level_str.n = P->s - vs;
                }
            } else if (*vs == '-' || (*vs >= '0' && *vs <= '9')) {
                if (!parse_number(P, &is_int, &v))
                    return;
                if (is_int && v >= 10 && v <= 60 && v % 10 == 0)
                    out->level = (int)v;
            } else if (!parse_value(P, 2)) {
                return;
            }
        } else if (R->ecs && (f = top_key(k, kn, &roots)) >= 0) {
            uint32_t before = out->found;
            int r = f < NFIELDS ? take_source(P, 2, f, data, out)
                : *vs == '{' ? take_members(P, 2, f - NFIELDS, data, out) : parse_value(P, 2);
            if (!r)
                return;
            removed = f < NFIELDS ? out->found != before : r == 2;
        } else {
            if (!parse_value(P, 2))
                return;
            if (key_is(k, kn, "msg", 3)) {
                if (!(P->s - vs == 4 && memcmp(vs, "null", 4) == 0)) {
                    msg.p = vs;
                    msg.n = P->s - vs;
                }
            } else if (key_is(k, kn, "message", 7)) {
                has_message = 1;
            }
        }
        if (out->replace && !member_done(&top, out, (k - 1) - data, P->s - data, removed))
            return;
    } while ((more = after_item(P, '}')) == 1);
    if (more != 2)
        return;
    out->body_end = P->s - data;
    skip_ws(P);
    if (P->s != P->e || !have_time)
        return;
    if (out->found) {
        for (unsigned have = (roots | R->fixed_roots) & ((1u << NROOTS) - 1); have; have &= have - 1)
            if (out->found & root_fields[__builtin_ctz(have)])
                return;   /* an ECS object of the line's own (or the input's fields) gets fields: the fallback merges */
        out->ecs_n = ecs_size(out);
        if (out->ncut && !sort_cuts(out))
            return;
    }
    if (has_message)
        msg.n = 0;
    out->msg = msg;
    out->ok = 1;
}

/* ---------------------------------------------------------------- output */

static inline char *put(char *w, const void *src, Py_ssize_t n) {
    memcpy(w, src, (size_t)n);
    return w + n;
}

static int fmt_uint(char *buf, long long v) {  /* v >= 0; returns the length */
    char tmp[24];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    for (int i = 0; i < n; i++)
        buf[i] = tmp[n - 1 - i];
    return n;
}

static inline void two(char *w, int v) {
    w[0] = (char)('0' + v / 10);
    w[1] = (char)('0' + v % 10);
}

/* `"}}\n{"@timestamp":"YYYY-MM-DDTHH:MM:SS.mmmZ"`: 44 bytes; epoch ms in 0..MS_YEAR_10000 - 1
 * (set_time_range) */
#define TS_LEN 44
static void fmt_ts(char *w, long long ms) {
    long long sec = ms / 1000;
    int milli = (int)(ms % 1000);
    long long days = sec / 86400;
    int rem = (int)(sec % 86400);
    /* civil_from_days (H. Hinnant) */
    long long z = days + 719468;
    long long era = z / 146097;
    long long doe = z - era * 146097;
    long long yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    long long y = yoe + era * 400;
    long long doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    long long mp = (5 * doy + 2) / 153;
    int d = (int)(doy - (153 * mp + 2) / 5 + 1);
    int m = (int)(mp < 10 ? mp + 3 : mp - 9);
    if (m <= 2)
        y++;
    memcpy(w, "\"}}\n{\"@timestamp\":\"", 19);
    w += 19;
    int yy = (int)y;
    w[0] = (char)('0' + yy / 1000);
    w[1] = (char)('0' + yy / 100 % 10);
    w[2] = (char)('0' + yy / 10 % 10);
    w[3] = (char)('0' + yy % 10);
    w[4] = '-';
    two(w + 5, m);
    w[7] = '-';
    two(w + 8, d);
    w[10] = 'T';
    two(w + 11, rem / 3600);
    w[13] = ':';
    two(w + 14, rem / 60 % 60);
    w[16] = ':';
    two(w + 17, rem % 60);
    w[19] = '.';
    w[20] = (char)('0' + milli / 100);
    w[21] = (char)('0' + milli / 10 % 10);
    w[22] = (char)('0' + milli % 10);
    w[23] = 'Z';
    w[24] = '"';
}

static const char *LEVEL_TEXT[7] = {NULL, ",\"level\":\"trace\"}", ",\"level\":\"debug\"}", ",\"level\":\"info\"}",
                                    ",\"level\":\"warn\"}", ",\"level\":\"error\"}", ",\"level\":\"fatal\"}"};
static const char MSG_KEY[] = ",\"message\":";
static const char LEVEL_KEY[] = ",\"level\":";
static const char HOSTNAME_KEY[] = ",\"hostname\":";


/* The ECS part of a pair is sized in the scan (ecs_size, arithmetic: no byte is formatted twice)
 * and written once (write_ecs, into the pair sized with it). Both take every literal from the
 * definitions below, and fuzz/scan_fuzz.c checks for every line the scan takes that write_ecs
 * writes exactly ecs_size bytes. */
#define LIT(s) s, (Py_ssize_t)sizeof(s) - 1
#define LIT_N(s) ((Py_ssize_t)sizeof(s) - 1)
#define HAS(S, f) ((S)->found >> (f) & 1u)

static const unsigned long long POW10U[20] = {
    1ull, 10ull, 100ull, 1000ull, 10000ull, 100000ull, 1000000ull, 10000000ull, 100000000ull, 1000000000ull,
    10000000000ull, 100000000000ull, 1000000000000ull, 10000000000000ull, 100000000000000ull,
    1000000000000000ull, 10000000000000000ull, 100000000000000000ull, 1000000000000000000ull,
    10000000000000000000ull};

/* the magnitude of v: |v| as an unsigned, LLONG_MIN included */
static inline unsigned long long magnitude(long long v) {
    return v < 0 ? 0ull - (unsigned long long)v : (unsigned long long)v;
}

/* the bytes of v in decimal, its '-' included */
static inline Py_ssize_t int_len(long long v) {
    unsigned long long u = magnitude(v);
    Py_ssize_t n = 1;
    while (n < 20 && u >= POW10U[n])
        n++;
    return n + (v < 0);
}

static inline char *put_int(char *w, long long v) {
    Py_ssize_t n = int_len(v);
    unsigned long long u = magnitude(v);
    char *end = w + n;
    do {
        *--end = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0)
        *--end = '-';
    return w + n;
}

static inline char *put_src(char *w, const scan_t *S, const unsigned char *data, int f) {
    memcpy(w, data + S->src[f].at, S->src[f].n);
    return w + S->src[f].n;
}

/* An ECS object whose members are copied as they are: its name and each member's source. */
typedef struct {
    const char *open;          /* `,"error":{` */
    Py_ssize_t open_n;
    uint32_t fields;           /* the F_x bits of its members */
    struct {
        int f;
        const char *key;       /* `"type":` */
        Py_ssize_t key_n;
    } m[3];
    int n;
} object_t;
static const object_t COPIED[] = {
    {LIT(",\"trace\":{"), 1u << F_TRACE, {{F_TRACE, LIT("\"id\":")}}, 1},
    {LIT(",\"span\":{"), 1u << F_SPAN, {{F_SPAN, LIT("\"id\":")}}, 1},
    {LIT(",\"transaction\":{"), 1u << F_TRANSACTION, {{F_TRANSACTION, LIT("\"id\":")}}, 1},
    {LIT(",\"error\":{"), 1u << F_ERR_TYPE | 1u << F_ERR_MESSAGE | 1u << F_ERR_STACK,
     {{F_ERR_TYPE, LIT("\"type\":")}, {F_ERR_MESSAGE, LIT("\"message\":")}, {F_ERR_STACK, LIT("\"stack_trace\":")}}, 3},
    {LIT(",\"process\":{"), 1u << F_PID, {{F_PID, LIT("\"pid\":")}}, 1},
    {LIT(",\"service\":{"), 1u << F_NAME, {{F_NAME, LIT("\"name\":")}}, 1},
    {LIT(",\"client\":{"), 1u << F_CLIENT_ADDRESS | 1u << F_CLIENT_PORT,
     {{F_CLIENT_ADDRESS, LIT("\"address\":")}, {F_CLIENT_PORT, LIT("\"port\":")}}, 2},
    {LIT(",\"user_agent\":{"), 1u << F_USER_AGENT, {{F_USER_AGENT, LIT("\"original\":")}}, 1},
};
#define NCOPIED (sizeof(COPIED) / sizeof(COPIED[0]))
#define HTTP_FIELDS (1u << F_REQ_ID | 1u << F_REQ_METHOD | 1u << F_STATUS)
#define REQUEST_FIELDS (1u << F_REQ_ID | 1u << F_REQ_METHOD)
static const char HTTP_OPEN[] = ",\"http\":{", REQUEST_OPEN[] = "\"request\":{", ID_KEY[] = "\"id\":",
    METHOD_KEY[] = "\"method\":", RESPONSE_OPEN[] = "\"response\":{\"status_code\":",
    URL_OPEN[] = ",\"url\":{\"original\":", PATH_KEY[] = ",\"path\":", QUERY_KEY[] = ",\"query\":\"",
    EVENT_OPEN[] = ",\"event\":{\"duration\":";

/* The bytes write_ecs writes for S (see above). */
static Py_ssize_t ecs_size(const scan_t *S) {
    Py_ssize_t n = 0;
    for (size_t i = 0; i < NCOPIED; i++) {
        const object_t *ob = &COPIED[i];
        if (!(S->found & ob->fields))
            continue;
        n += ob->open_n;                  /* its opening; its '}' counts as its first member's ',' */
        for (int j = 0; j < ob->n; j++)
            if (HAS(S, ob->m[j].f))
                n += 1 + ob->m[j].key_n + S->src[ob->m[j].f].n;
    }
    if (S->found & HTTP_FIELDS) {
        n += LIT_N(HTTP_OPEN) + 1;
        if (S->found & REQUEST_FIELDS) {
            n += LIT_N(REQUEST_OPEN) + 1;
            if (HAS(S, F_REQ_ID))
                n += LIT_N(ID_KEY) + (S->req_id_is_int ? 2 + int_len(S->req_id) : S->src[F_REQ_ID].n);
            if (HAS(S, F_REQ_METHOD))
                n += HAS(S, F_REQ_ID) + LIT_N(METHOD_KEY) + S->src[F_REQ_METHOD].n;
            n += HAS(S, F_STATUS);
        }
        if (HAS(S, F_STATUS))
            n += LIT_N(RESPONSE_OPEN) + S->src[F_STATUS].n + 1;
    }
    if (HAS(S, F_REQ_URL)) {
        Py_ssize_t un = S->src[F_REQ_URL].n, q = S->url_q;
        n += LIT_N(URL_OPEN) + un + LIT_N(PATH_KEY) + 1;
        if (q) {
            n += q + 1;
            if (un - q - 1 > 1)
                n += LIT_N(QUERY_KEY) + un - q - 1;
        } else {
            n += un;
        }
    }
    if (HAS(S, F_DURATION))
        n += LIT_N(EVENT_OPEN) + int_len(S->duration_ns) + 1;
    return n;
}

/* The ECS objects of a line the scan took (ecs.py's table; the line has none of them: scan_line),
 * as members of the document: `,"trace":{"id":..}`..., ecs_size(S) bytes at w; returns the end.
 * host.hostname goes with host.name, in write_pair. */
static char *write_ecs(char *w, const scan_t *S, const unsigned char *data) {
    for (size_t i = 0; i < NCOPIED; i++) {
        const object_t *ob = &COPIED[i];
        if (!(S->found & ob->fields))
            continue;
        w = put(w, ob->open, ob->open_n);
        int first = 1;
        for (int j = 0; j < ob->n; j++) {
            if (!HAS(S, ob->m[j].f))
                continue;
            if (!first)
                *w++ = ',';
            first = 0;
            w = put(w, ob->m[j].key, ob->m[j].key_n);
            w = put_src(w, S, data, ob->m[j].f);
        }
        *w++ = '}';
    }
    if (S->found & HTTP_FIELDS) {
        w = put(w, LIT(HTTP_OPEN));
        if (S->found & REQUEST_FIELDS) {
            w = put(w, LIT(REQUEST_OPEN));
            if (HAS(S, F_REQ_ID)) {
                w = put(w, LIT(ID_KEY));
                if (S->req_id_is_int) {
                    *w++ = '"';
                    w = put_int(w, S->req_id);
                    *w++ = '"';
                } else {
                    w = put_src(w, S, data, F_REQ_ID);
                }
            }
            if (HAS(S, F_REQ_METHOD)) {
                if (HAS(S, F_REQ_ID))
                    *w++ = ',';
                w = put(w, LIT(METHOD_KEY));
                w = put_src(w, S, data, F_REQ_METHOD);
            }
            *w++ = '}';
            if (HAS(S, F_STATUS))
                *w++ = ',';
        }
        if (HAS(S, F_STATUS)) {
            w = put(w, LIT(RESPONSE_OPEN));
            w = put_src(w, S, data, F_STATUS);
            *w++ = '}';
        }
        *w++ = '}';
    }
    if (HAS(S, F_REQ_URL)) {
        /* url.path and url.query: the raw text before and after its first '?' (req.url has no
         * escape: take_string), the query only when not empty */
        const unsigned char *u = data + S->src[F_REQ_URL].at;
        Py_ssize_t un = S->src[F_REQ_URL].n, q = S->url_q;
        w = put(w, LIT(URL_OPEN));
        w = put(w, u, un);
        w = put(w, LIT(PATH_KEY));
        if (q) {
            w = put(w, u, q);
            *w++ = '"';
            if (un - q - 1 > 1) {
                w = put(w, LIT(QUERY_KEY));
                w = put(w, u + q + 1, un - q - 1);
            }
        } else {
            w = put(w, u, un);
        }
        *w++ = '}';
    }
    if (HAS(S, F_DURATION)) {
        w = put(w, LIT(EVENT_OPEN));
        w = put_int(w, S->duration_ns);
        *w++ = '}';
    }
    return w;
}

#ifndef SHIPPER_SCAN_ONLY

/* What the bulk pairs of one call are written with (splice's arguments after `events`). */
typedef struct {
    PyObject *out, *head, *prefix_for, *fallback;
    const char *inc, *mid, *host, *tail;
    Py_ssize_t inc_n, mid_n, host_n, tail_n;
    rules_t R;
    long long cached_sec;
    PyObject *cached_head;     /* owned: prefix_for's answer for cached_sec */
    long long total;           /* bytes appended to out */
} emit_t;

/* The reserved keys, the time range and the ECS mode; 0 with an exception set when they are malformed. */
static int emit_init(emit_t *E, PyObject *head, PyObject *reserved, long long ms_min, long long ms_max, int ecs,
                     unsigned fixed_roots) {
    E->cached_sec = -1;
    E->cached_head = NULL;
    E->total = 0;
    if (head != Py_None && !PyBytes_Check(head)) {
        PyErr_SetString(PyExc_TypeError, "head: bytes or None");
        return 0;
    }
    if (ecs < ECS_OFF || ecs > ECS_REPLACE) {
        PyErr_SetString(PyExc_ValueError, "ecs: 0 (off), 1 (add) or 2 (replace)");
        return 0;
    }
    E->R.ecs = ecs;
    E->R.fixed_roots = fixed_roots;
    set_time_range(&E->R, ms_min, ms_max);
    E->R.n = (int)PyTuple_GET_SIZE(reserved);
    if (E->R.n > MAX_RESERVED) {
        PyErr_SetString(PyExc_ValueError, "too many reserved keys");
        return 0;
    }
    for (int i = 0; i < E->R.n; i++) {
        PyObject *k = PyTuple_GET_ITEM(reserved, i);
        if (!PyBytes_Check(k)) {
            PyErr_SetString(PyExc_TypeError, "reserved: a tuple of bytes");
            return 0;
        }
        E->R.keys[i].p = (const unsigned char *)PyBytes_AS_STRING(k);
        E->R.keys[i].n = PyBytes_GET_SIZE(k);
    }
    return 1;
}

/* The event the scan did not take, to the fallback; 0 on an exception. */
static int emit_fallback(emit_t *E, PyObject *ev) {
    PyObject *r = PyObject_CallOneArg(E->fallback, ev);
    if (r == NULL)
        return 0;
    long long got = PyLong_AsLongLong(r);
    Py_DECREF(r);
    if (got == -1 && PyErr_Occurred())
        return 0;
    E->total += got;
    return 1;
}

/* The action's start for a line the scan took: `head`, or prefix_for's answer for its second
 * (cached: the same object while the second stays); NULL on an exception. Borrowed. */
static PyObject *pair_head(emit_t *E, const scan_t *S) {
    if (E->head != Py_None)
        return E->head;
    long long sec = S->time_ms / 1000;
    if (E->cached_head == NULL || sec != E->cached_sec) {
        PyObject *r = PyObject_CallFunction(E->prefix_for, "L", sec);
        if (r == NULL || !PyBytes_Check(r)) {
            if (r != NULL) {
                Py_DECREF(r);
                PyErr_SetString(PyExc_TypeError, "prefix_for must return bytes");
            }
            return NULL;
        }
        Py_XSETREF(E->cached_head, r);
        E->cached_sec = sec;
    }
    return E->cached_head;
}

static inline const char *level_text(const scan_t *S, Py_ssize_t *n) {
    if (S->level) {
        *n = (Py_ssize_t)strlen(LEVEL_TEXT[S->level / 10]);
        return LEVEL_TEXT[S->level / 10];
    }
    *n = 1;
    return "}";
}

/* The bytes of the pair of a line the scan took, after the action head `hd`. */
static Py_ssize_t pair_size(const emit_t *E, const scan_t *S, long long start, PyObject *hd) {
    char sb[24];
    int sb_n = fmt_uint(sb, start);
    Py_ssize_t lv_n;
    level_text(S, &lv_n);
    Py_ssize_t body_n = S->body_end - 1 - S->cut_n;  /* the line from after its '{' to its '}', but the cuts */
    Py_ssize_t size = PyBytes_GET_SIZE(hd) + E->inc_n + sb_n + TS_LEN + E->mid_n + sb_n + lv_n + E->host_n + 1
        + E->tail_n + body_n + 1;
    if (S->found) {
        size += S->ecs_n;
        if (HAS(S, F_HOSTNAME))
            size += (Py_ssize_t)(sizeof(HOSTNAME_KEY) - 1) + S->src[F_HOSTNAME].n;
    }
    if (S->level_str.n)
        size += (Py_ssize_t)(sizeof(LEVEL_KEY) - 1) + S->level_str.n + 1 - lv_n;
    if (S->msg.n)
        size += (Py_ssize_t)(sizeof(MSG_KEY) - 1) + S->msg.n;
    return size;
}

/* Writes that pair at w (pair_size bytes); returns the end. */
static char *write_pair(const emit_t *E, const scan_t *S, const unsigned char *data, long long start, PyObject *hd,
                        char *w) {
    char sb[24];
    int sb_n = fmt_uint(sb, start);
    Py_ssize_t lv_n;
    const char *lv = level_text(S, &lv_n);
    w = put(w, PyBytes_AS_STRING(hd), PyBytes_GET_SIZE(hd));
    w = put(w, E->inc, E->inc_n);
    w = put(w, sb, sb_n);
    fmt_ts(w, S->time_ms);
    w += TS_LEN;
    w = put(w, E->mid, E->mid_n);
    w = put(w, sb, sb_n);
    if (S->level_str.n) {
        w = put(w, LEVEL_KEY, sizeof(LEVEL_KEY) - 1);
        w = put(w, S->level_str.p, S->level_str.n);
        *w++ = '}';
    } else {
        w = put(w, lv, lv_n);
    }
    w = put(w, E->host, E->host_n);
    if (S->found) {
        if (HAS(S, F_HOSTNAME)) {
            w = put(w, HOSTNAME_KEY, sizeof(HOSTNAME_KEY) - 1);
            w = put(w, data + S->src[F_HOSTNAME].at, S->src[F_HOSTNAME].n);
        }
        *w++ = '}';
        w = write_ecs(w, S, data);
    } else {
        *w++ = '}';
    }
    if (S->msg.n) {
        w = put(w, MSG_KEY, sizeof(MSG_KEY) - 1);
        w = put(w, S->msg.p, S->msg.n);
    }
    w = put(w, E->tail, E->tail_n);
    Py_ssize_t at = 1;
    for (int i = 0; i < S->ncut; i++) {
        w = put(w, data + at, S->cut[i].at - at);
        at = S->cut[i].at + S->cut[i].n;
    }
    w = put(w, data + at, S->body_end - at);
    *w++ = '\n';
    return w;
}

/* The bulk pair of a line the scan took (S->ok), appended to out; 0 on an exception. */
static int emit_pair(emit_t *E, const scan_t *S, const unsigned char *data, long long start) {
    PyObject *hd = pair_head(E, S);
    if (hd == NULL)
        return 0;
    Py_ssize_t size = pair_size(E, S, start, hd);
    PyObject *pair = PyBytes_FromStringAndSize(NULL, size);
    if (pair == NULL)
        return 0;
    write_pair(E, S, data, start, hd, PyBytes_AS_STRING(pair));
    int ok = PyList_Append(E->out, pair) == 0;
    Py_DECREF(pair);
    E->total += size;
    return ok;
}

static PyObject *splice(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *events_arg, *events, *head, *reserved;
    long long ms_min, ms_max;
    int ecs;
    unsigned int fixed_roots;
    emit_t E;
    if (!PyArg_ParseTuple(args, "O!O!OOy#y#y#y#O!OLL(iI)", &PyList_Type, &events_arg, &PyList_Type, &E.out, &head,
                          &E.prefix_for, &E.inc, &E.inc_n, &E.mid, &E.mid_n, &E.host, &E.host_n, &E.tail, &E.tail_n,
                          &PyTuple_Type, &reserved, &E.fallback, &ms_min, &ms_max, &ecs, &fixed_roots))
        return NULL;
    E.head = head;
    if (!emit_init(&E, head, reserved, ms_min, ms_max, ecs, fixed_roots))
        return NULL;

    /* our own list of the events: the bytes the scan points into stay alive whatever the
     * fallback (Python) does meanwhile */
    events = PyList_GetSlice(events_arg, 0, PyList_GET_SIZE(events_arg));
    if (events == NULL)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(events);
    scan_t *scans = PyMem_Malloc(sizeof(scan_t) * (size_t)(n ? n : 1));
    const unsigned char **datas = PyMem_Malloc(sizeof(*datas) * (size_t)(n ? n : 1));
    Py_ssize_t *lens = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(n ? n : 1));
    long long *starts = PyMem_Malloc(sizeof(long long) * (size_t)(n ? n : 1));
    parser_t *P = PyMem_Calloc(1, sizeof(parser_t));   /* the key table starts empty */
    if (!scans || !datas || !lens || !starts || !P) {
        PyMem_Free(scans);
        PyMem_Free(datas);
        PyMem_Free(lens);
        PyMem_Free(starts);
        PyMem_Free(P);
        Py_DECREF(events);
        return PyErr_NoMemory();
    }
    /* what needs the GIL: reading the tuples. An offset outside 0..2**63-1 (no file has one) is
     * the fallback's too, which writes any int. */
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *ev = PyList_GET_ITEM(events, i);
        datas[i] = NULL;
        if (!PyTuple_Check(ev) || PyTuple_GET_SIZE(ev) != 4)
            continue;
        PyObject *data = PyTuple_GET_ITEM(ev, 2), *flags = PyTuple_GET_ITEM(ev, 3), *st = PyTuple_GET_ITEM(ev, 0);
        if (!PyBytes_Check(data) || !PyLong_CheckExact(flags) || !PyLong_CheckExact(st))
            continue;
        int ovf = 0;   /* AndOverflow: no OverflowError left pending for a huge int */
        long fl = PyLong_AsLongAndOverflow(flags, &ovf);
        if (fl != 0 || ovf)
            continue;
        long long start = PyLong_AsLongLongAndOverflow(st, &ovf);
        if (ovf || start < 0)
            continue;
        datas[i] = (const unsigned char *)PyBytes_AS_STRING(data);
        lens[i] = PyBytes_GET_SIZE(data);
        starts[i] = start;
    }
    if (PyErr_Occurred())
        PyErr_Clear();   /* not reached for exact ints; an event with one is the fallback's anyway */
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        if (datas[i] == NULL)
            scans[i].ok = 0;
        else
            scan_line(P, datas[i], lens[i], &E.R, &scans[i]);
    }
    Py_END_ALLOW_THREADS
    PyMem_Free(P);

    int failed = 0;
    for (Py_ssize_t i = 0; i < n && !failed; i++) {
        if (!scans[i].ok)
            failed = !emit_fallback(&E, PyList_GET_ITEM(events, i));
        else
            failed = !emit_pair(&E, &scans[i], datas[i], starts[i]);
    }
    Py_XDECREF(E.cached_head);
    Py_DECREF(events);
    PyMem_Free(scans);
    PyMem_Free(datas);
    PyMem_Free(lens);
    PyMem_Free(starts);
    if (failed)
        return NULL;
    return PyLong_FromLongLong(E.total);
}

/* ---------------------------------------------------------------- line splitting
 *
 * split_lines(chunk, carry, pos, limit, truncated_flag) -> (lines, pos, tail_index)
 * The inner loop of LineSplitter.feed (shipper/tail/lines.py, which keeps the state and the
 * rules' reference in Python): every complete line of carry + chunk as (start, end, data, flags),
 * head NULs dropped (start moves past them), a trailing '\r' dropped, empty lines skipped, lines
 * past `limit` cut to it and flagged; `pos` after the last newline, and where the unterminated
 * tail starts in `chunk` (0 when there is no newline: the tail is then carry + chunk). `chunk`
 * and `carry` are any bytes-like objects (bytes, bytearray, memoryview); the lines are bytes. */
/* The rules for one complete line, a + b (a: the carry, for the first line only; b: the chunk up
 * to the newline): *k head NULs dropped, *n its length after them without a trailing '\r', cut
 * to limit (*flags = truncated then). 0: no line (nothing left). split_lines and split_splice. */
static inline int line_rules(const unsigned char *a, Py_ssize_t an, const unsigned char *b, Py_ssize_t bn,
                             Py_ssize_t limit, long truncated, Py_ssize_t *k_out, Py_ssize_t *n_out, long *flags) {
    Py_ssize_t n = an + bn, k = 0;
    while (k < n && (k < an ? a[k] : b[k - an]) == 0)
        k++;
    n -= k;
    if (n > 0 && (bn > 0 ? b[bn - 1] : a[an - 1]) == '\r')
        n--;
    if (n <= 0)
        return 0;
    *flags = 0;
    if (n > limit) {
        n = limit;
        *flags = truncated;
    }
    *k_out = k;
    *n_out = n;
    return 1;
}

/* split_lines and split_splice take the same limit and offsets; 0 with an exception set. */
static int split_args_ok(Py_ssize_t limit, long long pos, Py_ssize_t cn, Py_ssize_t carry_n) {
    if (limit < 1) {
        PyErr_SetString(PyExc_ValueError, "limit must be positive");
        return 0;
    }
    if (pos < 0 || pos > LLONG_MAX - cn - carry_n - 1) {
        PyErr_SetString(PyExc_OverflowError, "offset out of range");   /* LineSplitter loops in Python there */
        return 0;
    }
    return 1;
}

static PyObject *emit_line(PyObject *out, const char *a, Py_ssize_t an, const char *b, Py_ssize_t bn,
                           long long *pos, PyObject **end_obj, Py_ssize_t limit, long truncated) {
    Py_ssize_t n, k;
    long flags;
    long long start = *pos;
    *pos += an + bn + 1;
    PyObject *prev_end = *end_obj;   /* the previous line's end: usually this line's start */
    *end_obj = NULL;
    if (!line_rules((const unsigned char *)a, an, (const unsigned char *)b, bn, limit, truncated, &k, &n, &flags)) {
        Py_XDECREF(prev_end);
        return out;
    }
    PyObject *data;
    if (k >= an) {
        data = PyBytes_FromStringAndSize(b + (k - an), n);
    } else {
        data = PyBytes_FromStringAndSize(NULL, n);
        if (data != NULL) {
            char *w = PyBytes_AS_STRING(data);
            Py_ssize_t from_a = an - k < n ? an - k : n;
            memcpy(w, a + k, (size_t)from_a);
            if (n > from_a)
                memcpy(w + from_a, b, (size_t)(n - from_a));
        }
    }
    PyObject *st = NULL;
    if (prev_end != NULL && k == 0 && PyLong_AsLongLong(prev_end) == start) {
        st = prev_end;
        prev_end = NULL;
    } else {
        st = PyLong_FromLongLong(start + k);
    }
    Py_XDECREF(prev_end);
    PyObject *en = PyLong_FromLongLong(*pos);
    PyObject *fl = PyLong_FromLong(flags);
    if (data == NULL || st == NULL || en == NULL || fl == NULL) {
        Py_XDECREF(data);
        Py_XDECREF(st);
        Py_XDECREF(en);
        Py_XDECREF(fl);
        return NULL;
    }
    Py_INCREF(en);
    *end_obj = en;
    PyObject *t = PyTuple_Pack(4, st, en, data, fl);
    Py_DECREF(st);
    Py_DECREF(en);
    Py_DECREF(data);
    Py_DECREF(fl);
    if (t == NULL || PyList_Append(out, t) < 0) {
        Py_XDECREF(t);
        return NULL;
    }
    Py_DECREF(t);
    return out;
}

static PyObject *split_lines(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer cb, carry_b;   /* any bytes-like chunk (bytes, bytearray, memoryview); lines are bytes */
    long long pos;
    Py_ssize_t limit;
    long truncated;
    if (!PyArg_ParseTuple(args, "y*y*Lnl", &cb, &carry_b, &pos, &limit, &truncated))
        return NULL;
    PyObject *res = NULL, *out = NULL, *end_obj = NULL;
    const char *c = cb.buf, *carry = carry_b.buf;
    Py_ssize_t cn = cb.len, carry_n = carry_b.len;
    if (!split_args_ok(limit, pos, cn, carry_n))
        goto done;
    out = PyList_New(0);
    if (out == NULL)
        goto done;
    const char *p = c, *end = c + cn;
    int first = 1;
    for (;;) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        if (nl == NULL)
            break;
        PyObject *r = first ? emit_line(out, carry, carry_n, p, nl - p, &pos, &end_obj, limit, truncated)
                            : emit_line(out, NULL, 0, p, nl - p, &pos, &end_obj, limit, truncated);
        if (r == NULL) {
            Py_CLEAR(out);
            goto done;
        }
        first = 0;
        p = nl + 1;
    }
    res = Py_BuildValue("(NLn)", out, pos, (Py_ssize_t)(p - c));
done:
    Py_XDECREF(end_obj);
    PyBuffer_Release(&cb);
    PyBuffer_Release(&carry_b);
    return res;
}

/* ---------------------------------------------------------------- split and splice at once
 *
 * split_splice(chunk, carry, pos, limit, truncated_flag, sniff,
 *              out, counts, head, prefix_for, inc, mid, host, tail, reserved, fallback, ms_min, ms_max, ecs)
 *     -> (pos, tail_index, lines, first_start, last_end, nbytes, pairs) or None
 * The same as `lines, pos, tail_index = split_lines(chunk, carry, pos, limit, truncated_flag)`
 * followed by `nbytes = splice(lines, out, head, ...)`, with the same bytes in the same order
 * (tests/unit/test_split_splice.py and fuzz/fused_fuzz.py hold it to that), except that a line
 * the scan takes never becomes a Python object: it is scanned where it was read (in `chunk`),
 * and the pairs of consecutive such lines (under one action head) are written into ONE bytes
 * object appended to `out`; `counts[index in out] = n` says how many pairs one holds when more
 * than one (the record writer cuts them apart only when a batch must be split there). A line the
 * scan does not take becomes the (start, end, data, flags) tuple split_lines makes and goes to
 * `fallback`, in order, which appends its own pair. `lines` counts the complete lines, `pairs`
 * the pairs appended; first_start and last_end are the first line's start and the last one's
 * end (-1 without lines).
 * None, before anything is built or appended, when the caller must split and build this chunk
 * itself: the bytes after the last newline are more than `limit` (LineSplitter may cut them into
 * a line of their own, which goes with the others), or `sniff` (a callable or None) answers true
 * for the first and the last line's bytes (format auto: a container log, for the joiner).
 * In a backlog this saves the tuple, the bytes and the end int of every line, and reading them
 * back (issue 14). */
typedef struct {
    long long start, end;
    const unsigned char *p;
    Py_ssize_t n;
    long flags;
} fline_t;

static PyObject *split_splice(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer cb, carry_b;
    long long pos;
    Py_ssize_t limit;
    long truncated;
    PyObject *head, *reserved, *sniff, *counts;
    long long ms_min, ms_max;
    int ecs;
    unsigned int fixed_roots;
    emit_t E;
    if (!PyArg_ParseTuple(args, "y*y*LnlOO!O!OOy#y#y#y#O!OLL(iI)", &cb, &carry_b, &pos, &limit, &truncated, &sniff,
                          &PyList_Type, &E.out, &PyDict_Type, &counts, &head, &E.prefix_for, &E.inc, &E.inc_n, &E.mid, &E.mid_n,
                          &E.host, &E.host_n, &E.tail, &E.tail_n, &PyTuple_Type, &reserved, &E.fallback, &ms_min, &ms_max,
                          &ecs, &fixed_roots))
        return NULL;
    E.head = head;
    E.cached_head = NULL;
    PyObject *res = NULL;
    fline_t *lines = NULL;
    scan_t *scans = NULL;
    parser_t *P = NULL;
    unsigned char *joined = NULL;   /* the first line when it starts in the carry */
    Py_ssize_t nlines = 0, cap = 0;
    int nomem = 0;
    const unsigned char *c = cb.buf, *carry = carry_b.buf;
    Py_ssize_t cn = cb.len, carry_n = carry_b.len;
    const unsigned char *p = c, *end = c + cn;
    if (!emit_init(&E, head, reserved, ms_min, ms_max, ecs, fixed_roots) || !split_args_ok(limit, pos, cn, carry_n))
        goto done;
    /* the lines and their scans, without the GIL: the buffers stay exported to us meanwhile */
    Py_BEGIN_ALLOW_THREADS
    int first = 1;
    for (;;) {
        const unsigned char *nl = memchr(p, '\n', (size_t)(end - p));
        if (nl == NULL)
            break;
        const unsigned char *a = first ? carry : NULL, *b = p;
        Py_ssize_t an = first ? carry_n : 0, bn = nl - p;
        first = 0;
        p = nl + 1;
        Py_ssize_t n, k;
        long flags;
        long long start = pos;
        pos += an + bn + 1;
        if (!line_rules(a, an, b, bn, limit, truncated, &k, &n, &flags))
            continue;
        const unsigned char *data;
        if (k >= an) {
            data = b + (k - an);
        } else {
            joined = PyMem_RawMalloc((size_t)n);
            if (joined == NULL) {
                nomem = 1;
                break;
            }
            Py_ssize_t from_a = an - k < n ? an - k : n;
            memcpy(joined, a + k, (size_t)from_a);
            if (n > from_a)
                memcpy(joined + from_a, b, (size_t)(n - from_a));
            data = joined;
        }
        if (nlines == cap) {
            Py_ssize_t ncap = cap ? 2 * cap : 256;
            fline_t *grown = PyMem_RawRealloc(lines, sizeof(fline_t) * (size_t)ncap);
            if (grown == NULL) {
                nomem = 1;
                break;
            }
            lines = grown;
            cap = ncap;
        }
        lines[nlines++] = (fline_t){start + k, pos, data, n, flags};
    }
    if (!nomem && nlines) {
        scans = PyMem_RawMalloc(sizeof(scan_t) * (size_t)nlines);
        P = PyMem_RawCalloc(1, sizeof(parser_t));   /* the key table starts empty */
        if (scans == NULL || P == NULL)
            nomem = 1;
        else
            for (Py_ssize_t i = 0; i < nlines; i++) {
                if (lines[i].flags != 0)
                    scans[i].ok = 0;   /* a cut line: the fallback's, as in splice */
                else
                    scan_line(P, lines[i].p, lines[i].n, &E.R, &scans[i]);
            }
    }
    Py_END_ALLOW_THREADS
    if (nomem) {
        PyErr_NoMemory();
        goto done;
    }
    if (nlines && end - p > limit) {
        res = Py_NewRef(Py_None);
        goto done;
    }
    if (nlines && sniff != Py_None) {
        PyObject *r = PyObject_CallFunction(sniff, "y#y#", (const char *)lines[0].p, lines[0].n,
                                            (const char *)lines[nlines - 1].p, lines[nlines - 1].n);
        if (r == NULL)
            goto done;
        int yes = PyObject_IsTrue(r);
        Py_DECREF(r);
        if (yes < 0)
            goto done;
        if (yes) {
            res = Py_NewRef(Py_None);
            goto done;
        }
    }
    Py_ssize_t ndocs = 0;
    for (Py_ssize_t i = 0; i < nlines;) {
        if (!scans[i].ok) {
            const fline_t *L = &lines[i++];
            PyObject *ev = Py_BuildValue("(LLy#l)", L->start, L->end, (const char *)L->p, L->n, L->flags);
            if (ev == NULL)
                goto done;
            Py_ssize_t before = PyList_GET_SIZE(E.out);
            int ok = emit_fallback(&E, ev);
            Py_DECREF(ev);
            if (!ok)
                goto done;
            ndocs += PyList_GET_SIZE(E.out) - before;
            continue;
        }
        /* a run of lines the scan took, under one action head: their pairs in one bytes object */
        PyObject *hd = pair_head(&E, &scans[i]);
        if (hd == NULL)
            goto done;
        Py_INCREF(hd);
        Py_ssize_t j = i, size = 0;
        while (j < nlines && scans[j].ok) {
            PyObject *h = pair_head(&E, &scans[j]);
            if (h == NULL) {
                Py_DECREF(hd);
                goto done;
            }
            if (h != hd)
                break;
            size += pair_size(&E, &scans[j], lines[j].start, hd);
            j++;
        }
        PyObject *run = PyBytes_FromStringAndSize(NULL, size);
        if (run == NULL) {
            Py_DECREF(hd);
            goto done;
        }
        char *w = PyBytes_AS_STRING(run);
        for (Py_ssize_t k = i; k < j; k++)
            w = write_pair(&E, &scans[k], lines[k].p, lines[k].start, hd, w);
        Py_DECREF(hd);
        int ok = PyList_Append(E.out, run) == 0;
        Py_DECREF(run);
        if (!ok)
            goto done;
        if (j - i > 1) {
            PyObject *key = PyLong_FromSsize_t(PyList_GET_SIZE(E.out) - 1), *val = PyLong_FromSsize_t(j - i);
            ok = key != NULL && val != NULL && PyDict_SetItem(counts, key, val) == 0;
            Py_XDECREF(key);
            Py_XDECREF(val);
            if (!ok)
                goto done;
        }
        E.total += size;
        ndocs += j - i;
        i = j;
    }
    res = Py_BuildValue("(LnnLLLn)", pos, (Py_ssize_t)(p - c), nlines, nlines ? lines[0].start : -1LL,
                        nlines ? lines[nlines - 1].end : -1LL, E.total, ndocs);
done:
    Py_XDECREF(E.cached_head);
    PyMem_RawFree(lines);
    PyMem_RawFree(scans);
    PyMem_RawFree(P);
    PyMem_RawFree(joined);
    PyBuffer_Release(&cb);
    PyBuffer_Release(&carry_b);
    return res;
}

static PyMethodDef methods[] = {
    {"splice", splice, METH_VARARGS, "Append the bulk pairs of a batch of events to a list (see the module)."},
    {"split_lines", split_lines, METH_VARARGS, "The complete lines of carry + chunk (see LineSplitter.feed)."},
    {"split_splice", split_splice, METH_VARARGS, "split_lines, then splice of its lines, without making the lines the scan takes."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "shipper._native",
                                    "The C fast paths of the reading side: line splitting and JSON line -> bulk pair.", -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__native(void) {
    init_tables();
    return PyModule_Create(&module);
}

#endif /* SHIPPER_SCAN_ONLY */
