/* libFuzzer harness for the scan of shipper/_native.c (no Python: -DSHIPPER_SCAN_ONLY).
 *
 * Each input is one line. It is copied into a heap buffer of exactly its length, so a read one
 * byte past the line is an AddressSanitizer report (a bytes object has a NUL there, which hides
 * such a read in the extension). The scan runs under two sets of rules and twice each: with a
 * parser that scanned every earlier input (its key table must come back empty whatever a line
 * left in it) and with a fresh one; both must find the same. For a line the scan takes it checks
 * what splice relies on: the body ends in '}' inside the line, the noted spans lie inside it,
 * the line has no raw newline or control byte, `time` is within the rules' range and the
 * formatted @timestamp has exactly the layout YYYY-MM-DDTHH:MM:SS.mmmZ; the ECS sources it noted
 * lie in the body and what write_ecs makes of them is balanced JSON. Rules: ecs add, replace, off.
 *
 *   fuzz/build.sh && build/fuzz/scan_fuzz -dict=fuzz/json.dict build/fuzz/corpus/scan
 */
#define SHIPPER_SCAN_ONLY
#include "../shipper/_native.c"

#include <stdio.h>
#include <stdlib.h>

static parser_t *kept;     /* the parser every input goes through in turn */
static rules_t rules[3];

static void add_key(rules_t *R, const char *k) {
    R->keys[R->n].p = (const unsigned char *)k;
    R->keys[R->n].n = (Py_ssize_t)strlen(k);
    R->n++;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    init_tables();
    kept = calloc(1, sizeof(parser_t));
    /* what DocBuilder passes for a plain input (ecs: add, the default) */
    add_key(&rules[0], "@timestamp");
    add_key(&rules[0], "log");
    add_key(&rules[0], "host");
    set_time_range(&rules[0], 100000000001LL, 1LL << 42);
    rules[0].ecs = ECS_ADD;
    /* an input with fields, and a range asking for more than a 4-digit year: set_time_range clamps */
    add_key(&rules[1], "@timestamp");
    add_key(&rules[1], "log");
    add_key(&rules[1], "host");
    add_key(&rules[1], "env");
    add_key(&rules[1], "");
    set_time_range(&rules[1], -5, LLONG_MAX);
    rules[1].ecs = ECS_REPLACE;
    /* ecs: off */
    add_key(&rules[2], "@timestamp");
    add_key(&rules[2], "log");
    add_key(&rules[2], "host");
    set_time_range(&rules[2], 100000000001LL, 1LL << 42);
    return 0;
}

#define CHECK(cond)                                                           \
    do {                                                                      \
        if (!(cond)) {                                                        \
            fprintf(stderr, "scan_fuzz: check failed: %s (line %d)\n", #cond, __LINE__); \
            abort();                                                          \
        }                                                                     \
    } while (0)

static int inside(const unsigned char *buf, size_t size, span_t sp) {
    return sp.p >= buf && sp.n >= 0 && (size_t)(sp.p - buf) + (size_t)sp.n <= size;
}

static void check_taken(const unsigned char *buf, size_t size, const rules_t *R, const scan_t *S) {
    CHECK(S->body_end >= 2 && (size_t)S->body_end <= size);
    CHECK(buf[0] == '{' && buf[S->body_end - 1] == '}');
    for (size_t i = 0; i < size; i++)
        CHECK(buf[i] >= 0x20 || buf[i] == ' ' || buf[i] == '\t' || buf[i] == '\r');
    for (size_t i = (size_t)S->body_end; i < size; i++)
        CHECK(buf[i] == ' ' || buf[i] == '\t' || buf[i] == '\r');
    CHECK(S->time_ms >= R->ms_min && S->time_ms < R->ms_max && S->time_ms < MS_YEAR_10000);
    CHECK(S->level == 0 || (S->level >= 10 && S->level <= 60 && S->level % 10 == 0));
    if (S->msg.n) {
        CHECK(inside(buf, size, S->msg));
    }
    if (S->level_str.n) {
        CHECK(inside(buf, size, S->level_str) && S->level_str.n > 2);
        CHECK(S->level_str.p[0] == '"' && S->level_str.p[S->level_str.n - 1] == '"');
    }
    /* the ECS sources: only with ecs on, never with replace (that line is Python's), each inside
     * the body, a string with its quotes or a number token; what write_ecs writes is valid JSON */
    CHECK(R->ecs != ECS_OFF || S->found == 0);
    /* replace: the cuts are sorted, apart, inside the body; without replace there are none */
    CHECK(S->ncut >= 0 && S->ncut <= MAX_CUTS && (S->ncut == 0 || R->ecs == ECS_REPLACE));
    Py_ssize_t cut = 0;
    for (int i = 0; i < S->ncut; i++) {
        CHECK(S->cut[i].n > 0 && S->cut[i].at >= 1 && (Py_ssize_t)(S->cut[i].at + S->cut[i].n) <= S->body_end - 1);
        CHECK(i == 0 || S->cut[i].at > S->cut[i - 1].at + S->cut[i - 1].n);
        cut += S->cut[i].n;
    }
    CHECK(cut == S->cut_n);
    for (int f = 0; f < NFIELDS; f++) {
        if (!(S->found >> f & 1))
            continue;
        const unsigned char *v = buf + S->src[f].at;
        CHECK(S->src[f].n > 0 && (size_t)S->src[f].at + S->src[f].n <= (size_t)S->body_end);
        if (v[0] == '"')
            CHECK(S->src[f].n >= 2 && v[S->src[f].n - 1] == '"');
        else
            CHECK(v[0] == '-' || (v[0] >= '0' && v[0] <= '9'));
        if (f == F_REQ_URL && S->url_q)
            CHECK(S->url_q < S->src[f].n - 1 && v[S->url_q] == '?');
    }
    if (S->found) {
        /* write_ecs writes exactly the ecs_size the scan noted (pair_size relies on it): into a
         * buffer of its sources' bytes twice (req.url is copied twice) and every literal, with a
         * guard zone after it that must stay untouched */
        Py_ssize_t room = 2 * (Py_ssize_t)size + 1024;
        char *w = malloc((size_t)room + 64);
        CHECK(w != NULL);
        memset(w, 0x7f, (size_t)room + 64);
        w[0] = '{';
        char *end = write_ecs(w + 1, S, buf);
        Py_ssize_t n = end - (w + 1);
        CHECK(n == S->ecs_n && n == ecs_size(S) && n <= room && (n == 0 || w[1] == ','));   /* host.hostname alone: nothing here */
        for (Py_ssize_t i = n + 1; i < room + 64; i++)
            CHECK(w[i] == 0x7f);
        /* balanced braces outside strings, and no raw control byte */
        int depth = 0, in_str = 0;
        for (Py_ssize_t i = 2; i <= n; i++) {
            char c = w[i];
            CHECK((unsigned char)c >= 0x20);
            if (in_str) {
                if (c == '\\')
                    i++;
                else if (c == '"')
                    in_str = 0;
            } else if (c == '"') {
                in_str = 1;
            } else if (c == '{') {
                depth++;
            } else if (c == '}') {
                CHECK(--depth >= 0);
            }
        }
        CHECK(depth == 0 && !in_str);
        free(w);
    }
    char ts[TS_LEN + 1];
    ts[TS_LEN] = 0x7f;
    fmt_ts(ts, S->time_ms);
    CHECK(ts[TS_LEN] == 0x7f && memcmp(ts, "\"}}\n{\"@timestamp\":\"", 19) == 0 && ts[TS_LEN - 1] == '"');
    static const char layout[] = "dddd-dd-ddTdd:dd:dd.dddZ";
    for (int i = 0; i < 24; i++) {
        char c = ts[19 + i];
        CHECK(layout[i] == 'd' ? (c >= '0' && c <= '9') : c == layout[i]);
    }
}

static int same(const scan_t *a, const scan_t *b) {
    if (a->ok != b->ok)
        return 0;
    if (!a->ok)
        return 1;
    /* a span's start means something only when it is not empty */
    if (a->found != b->found)
        return 0;
    for (int f = 0; f < NFIELDS; f++)
        if (a->found >> f & 1 && (a->src[f].at != b->src[f].at || a->src[f].n != b->src[f].n))
            return 0;
    if (a->found >> F_DURATION & 1 && a->duration_ns != b->duration_ns)
        return 0;
    return a->level == b->level && a->time_ms == b->time_ms && a->body_end == b->body_end
        && a->msg.n == b->msg.n && (a->msg.n == 0 || a->msg.p == b->msg.p)
        && a->level_str.n == b->level_str.n && (a->level_str.n == 0 || a->level_str.p == b->level_str.p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    unsigned char *buf = malloc(size ? size : 1);
    if (buf == NULL)
        return 0;
    if (size)
        memcpy(buf, data, size);
    parser_t *fresh = calloc(1, sizeof(parser_t));
    for (int r = 0; r < 3; r++) {
        scan_t a, b;
        scan_line(kept, buf, (Py_ssize_t)size, &rules[r], &a);
        scan_line(fresh, buf, (Py_ssize_t)size, &rules[r], &b);
        CHECK(same(&a, &b));
        if (a.ok)
            check_taken(buf, size, &rules[r], &a);
    }
    free(fresh);
    free(buf);
    return 0;
}
