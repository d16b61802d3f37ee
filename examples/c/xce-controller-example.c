/*
 * xce-controller-example: a small controller in C on libxce_receiver, the template for
 * wiring the library into xce's controller (docs/controller.md).
 *
 *   xce-controller-example ADDR --tls-ca F --tls-cert F --tls-key F [--tls-crl F]
 *   xce-controller-example ADDR --insecure
 *     [--domain D]... [--agent-heartbeat-ms N] [--queue N] [--assign HOST=NAME@INSTANCE]...
 *
 * One line per event on stdout:
 *   accepted HOST peer=P subject="S" sans=A,B agent=V boot_id=B digest=D resources=N
 *   resval HOST NAME[@INSTANCE] VALUE STATUS last_report=MS [error="..."]
 *   stale HOST grace_ms=N unknown=K
 *   gone HOST REASON peer=P text="..."
 *   refused PEER REASON text="..."
 * The library's log (why a connection was dropped or refused, a host cut off over its memory
 * share, evictions) on stderr, one line each: "xce-controller-example: log LEVEL: LINE".
 * SIGUSR1 prints the table ("table HOST NAME[@INSTANCE] VALUE STATUS") and the library's
 * snapshot ("snapshot ..."); SIGTERM/SIGINT stop the receiver, free everything and exit 0.
 *
 * The table is the integration the controller research traces: per host an array of
 * resvals, one slot per resource the host declared, filled the way xce's update_val_res()
 * fills w->host.resvals[idx]; values go unknown ("-") when the library says the host is
 * stale, and come back when it reports again.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "xce_receiver.h"

/* ---- the controller's table: hosts, each with its declared resources' values ---- */

struct resval {
    char *name;     /* resource name */
    char *instance; /* "" for the host's own */
    int known;      /* 0: unknown ("-") */
    xce_value_type type;
    double numeric;
    char *string;
    bool boolean;
    xce_status status;
};

struct host {
    char *name;
    struct resval *resvals; /* w->host.resvals: one per declared resource */
    size_t nresvals;
    int connected;
    struct host *next;        /* every host, for the table and the end */
    struct host *bucket_next; /* the hosts of one bucket of the index */
};

static struct host *hosts;

/* Hosts by name: every event names its host, and a controller with 10,000 of them must not
 * walk a list per event (BENCHMARKS.md section 20 measured that walk at 86% of the
 * example's cost per value). Chained buckets, FNV-1a of the name; about one host a bucket
 * at 16,000 hosts. */
#define HOST_BUCKETS 16384
static struct host *buckets[HOST_BUCKETS];

static size_t bucket_of(const char *name) {
    uint64_t h = 14695981039346656037ULL;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
        h ^= *p;
        h *= 1099511628211ULL;
    }
    return (size_t)(h & (HOST_BUCKETS - 1));
}

static char *dup_str(const char *s) {
    char *d = strdup(s);
    if (!d) {
        perror("strdup");
        exit(3);
    }
    return d;
}

static struct host *find_host(const char *name) {
    for (struct host *h = buckets[bucket_of(name)]; h; h = h->bucket_next)
        if (strcmp(h->name, name) == 0)
            return h;
    return NULL;
}

static void clear_resvals(struct host *h) {
    for (size_t i = 0; i < h->nresvals; i++) {
        free(h->resvals[i].name);
        free(h->resvals[i].instance);
        free(h->resvals[i].string);
    }
    free(h->resvals);
    h->resvals = NULL;
    h->nresvals = 0;
}

/* A host's hello: its slots are the declared resources, all unknown until the snapshot. */
static void host_accepted(const xce_event *ev) {
    struct host *h = find_host(ev->host);
    if (!h) {
        h = calloc(1, sizeof *h);
        if (!h) {
            perror("calloc");
            exit(3);
        }
        h->name = dup_str(ev->host);
        h->next = hosts;
        hosts = h;
        size_t b = bucket_of(h->name);
        h->bucket_next = buckets[b];
        buckets[b] = h;
    }
    clear_resvals(h);
    h->connected = 1;
    if (ev->n_resources == 0)
        return;
    h->resvals = calloc(ev->n_resources, sizeof *h->resvals);
    if (!h->resvals) {
        perror("calloc");
        exit(3);
    }
    h->nresvals = ev->n_resources;
    for (size_t i = 0; i < ev->n_resources; i++) {
        h->resvals[i].name = dup_str(ev->resources[i].name);
        h->resvals[i].instance = dup_str(ev->resources[i].instance);
    }
}

/* update_val_res(): find the resource's index among the host's, store the value there. */
static void update_val_res(const xce_event *ev) {
    struct host *h = find_host(ev->host);
    if (!h)
        return;
    for (size_t idx = 0; idx < h->nresvals; idx++) {
        struct resval *r = &h->resvals[idx];
        if (strcmp(r->name, ev->name) != 0 || strcmp(r->instance, ev->instance) != 0)
            continue;
        free(r->string);
        r->string = NULL;
        r->type = ev->value.kind;
        r->known = ev->value.kind != XCE_VALUE_UNKNOWN;
        r->numeric = ev->value.numeric;
        r->boolean = ev->value.boolean;
        if (ev->value.kind == XCE_VALUE_STRING)
            r->string = dup_str(ev->value.string);
        r->status = ev->status;
        return;
    }
}

/* Stale: every value of the host is unknown until it reports again. */
static size_t host_stale(const char *name) {
    struct host *h = find_host(name);
    if (!h)
        return 0;
    for (size_t i = 0; i < h->nresvals; i++) {
        h->resvals[i].known = 0;
        h->resvals[i].status = XCE_STATUS_STALE;
    }
    return h->nresvals;
}

static void free_hosts(void) {
    while (hosts) {
        struct host *next = hosts->next;
        clear_resvals(hosts);
        free(hosts->name);
        free(hosts);
        hosts = next;
    }
    memset(buckets, 0, sizeof buckets);
}

/* ---- printing ---- */

/* Text from the network, printed so that one event stays one line. */
static void put_text(const char *s) {
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            printf("\\%c", *p);
        else if (*p < 0x20 || *p == 0x7f)
            printf("\\x%02x", *p);
        else
            putchar(*p);
    }
}

static void put_value(xce_value_type type, double numeric, const char *string, bool boolean) {
    switch (type) {
    case XCE_VALUE_NUMERIC: printf("%g", numeric); break;
    case XCE_VALUE_STRING: putchar('"'); put_text(string); putchar('"'); break;
    case XCE_VALUE_BOOLEAN: fputs(boolean ? "true" : "false", stdout); break;
    default: putchar('-'); break;
    }
}

static const char *status_str(xce_status s) {
    switch (s) {
    case XCE_STATUS_OK: return "ok";
    case XCE_STATUS_FAILED: return "failed";
    case XCE_STATUS_STALE: return "stale";
    case XCE_STATUS_PENDING: return "pending";
    }
    return "?";
}

static void put_name(const char *name, const char *instance) {
    put_text(name);
    if (instance[0]) {
        putchar('@');
        put_text(instance);
    }
}

static void print_event(const char *prefix, const xce_event *ev) {
    fputs(prefix, stdout);
    switch (ev->kind) {
    case XCE_EVENT_ACCEPTED:
        fputs("accepted ", stdout);
        put_text(ev->host);
        printf(" peer=%s subject=\"", ev->peer);
        put_text(ev->subject);
        fputs("\" sans=", stdout);
        for (size_t i = 0; i < ev->n_sans; i++) {
            if (i)
                putchar(',');
            put_text(ev->sans[i]);
        }
        fputs(" agent=", stdout);
        put_text(ev->agent_version);
        fputs(" boot_id=", stdout);
        put_text(ev->boot_id);
        fputs(" digest=", stdout);
        put_text(ev->config_digest);
        printf(" resources=%zu\n", ev->n_resources);
        break;
    case XCE_EVENT_RESVAL:
        fputs("resval ", stdout);
        put_text(ev->host);
        putchar(' ');
        put_name(ev->name, ev->instance);
        putchar(' ');
        put_value(ev->value.kind, ev->value.numeric, ev->value.string, ev->value.boolean);
        printf(" %s last_report=%llu", status_str(ev->status),
               (unsigned long long)ev->last_report_ms);
        if (ev->error[0]) {
            fputs(" error=\"", stdout);
            put_text(ev->error);
            putchar('"');
        }
        putchar('\n');
        break;
    case XCE_EVENT_STALE:
        fputs("stale ", stdout);
        put_text(ev->host);
        printf(" grace_ms=%llu", (unsigned long long)ev->grace_ms);
        break; /* the caller ends the line */
    case XCE_EVENT_GONE:
        fputs("gone ", stdout);
        put_text(ev->host);
        printf(" %s peer=%s text=\"", xce_reason_str(ev->reason), ev->peer);
        put_text(ev->reason_text);
        fputs("\"\n", stdout);
        break;
    case XCE_EVENT_REFUSED:
        printf("refused %s %s text=\"", ev->peer, xce_reason_str(ev->reason));
        put_text(ev->reason_text);
        fputs("\"\n", stdout);
        break;
    }
}

static void handle(const xce_event *ev) {
    switch (ev->kind) {
    case XCE_EVENT_ACCEPTED: host_accepted(ev); break;
    case XCE_EVENT_RESVAL: update_val_res(ev); break;
    case XCE_EVENT_GONE: {
        struct host *h = find_host(ev->host);
        if (h)
            h->connected = 0;
        break;
    }
    default: break;
    }
    print_event("", ev);
    if (ev->kind == XCE_EVENT_STALE)
        printf(" unknown=%zu\n", host_stale(ev->host));
}

static void print_table(xce_receiver *rx) {
    for (struct host *h = hosts; h; h = h->next)
        for (size_t i = 0; i < h->nresvals; i++) {
            struct resval *r = &h->resvals[i];
            fputs("table ", stdout);
            put_text(h->name);
            putchar(' ');
            put_name(r->name, r->instance);
            putchar(' ');
            put_value(r->known ? r->type : XCE_VALUE_UNKNOWN, r->numeric,
                      r->string ? r->string : "", r->boolean);
            printf(" %s\n", status_str(r->status));
        }
    xce_event **snap = NULL;
    size_t n = 0;
    if (xce_receiver_snapshot(rx, NULL, &snap, &n) == XCE_OK) {
        for (size_t i = 0; i < n; i++) {
            print_event("snapshot ", snap[i]);
            if (snap[i]->kind == XCE_EVENT_STALE)
                putchar('\n');
        }
        if (snap)
            xce_events_free(snap, n);
    }
    puts("table end");
}

/* ---- signals: a self-pipe that poll() watches beside the library's fd ---- */

static int sig_pipe[2] = {-1, -1};

static void on_signal(int sig) {
    unsigned char b = (unsigned char)sig;
    int saved = errno;
    ssize_t n = write(sig_pipe[1], &b, 1);
    (void)n;
    errno = saved;
}

/* The library's log lines. Called on the library's threads (one call at a time per
 * receiver): it does nothing but write the line, and calls no xce_* function. */
static void on_log(void *userdata, xce_log_level level, const char *message, size_t len) {
    static const char *const names[] = {"?", "error", "warn", "info", "debug", "trace"};
    (void)userdata;
    const char *name = level >= XCE_LOG_ERROR && level <= XCE_LOG_TRACE ? names[level] : names[0];
    fprintf(stderr, "xce-controller-example: log %s: %.*s\n", name, (int)len, message);
}

static void die_lib(const char *what, xce_result r) {
    char msg[1024];
    xce_last_error(msg, sizeof msg, NULL);
    fprintf(stderr, "xce-controller-example: %s: %s: %s\n", what, xce_result_str(r), msg);
    exit(2);
}

static void usage(void) {
    fputs("usage: xce-controller-example ADDR (--tls-ca F --tls-cert F --tls-key F [--tls-crl F]"
          " | --insecure) [--domain D]... [--agent-heartbeat-ms N] [--queue N]"
          " [--assign HOST=NAME@INSTANCE]...\n",
          stderr);
    exit(2);
}

int main(int argc, char **argv) {
    const char *addr = NULL, *ca = NULL, *cert = NULL, *key = NULL, *crl = NULL;
    int insecure = 0;
    unsigned long long heartbeat_ms = 0;
    size_t queue = 0;
    const char *assigns[64];
    size_t nassigns = 0;
    const char *domains[16];
    size_t ndomains = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--insecure") == 0) {
            insecure = 1;
            continue;
        }
        if (a[0] != '-') {
            if (addr)
                usage();
            addr = a;
            continue;
        }
        if (!v)
            usage();
        i++;
        if (strcmp(a, "--tls-ca") == 0) ca = v;
        else if (strcmp(a, "--tls-cert") == 0) cert = v;
        else if (strcmp(a, "--tls-key") == 0) key = v;
        else if (strcmp(a, "--tls-crl") == 0) crl = v;
        else if (strcmp(a, "--agent-heartbeat-ms") == 0) heartbeat_ms = strtoull(v, NULL, 10);
        else if (strcmp(a, "--queue") == 0) queue = (size_t)strtoull(v, NULL, 10);
        else if (strcmp(a, "--assign") == 0 && nassigns < 64) assigns[nassigns++] = v;
        else if (strcmp(a, "--domain") == 0 && ndomains < 16) domains[ndomains++] = v;
        else usage();
    }
    if (!addr || (!insecure && (!ca || !cert || !key)))
        usage();

    xce_receiver_config *cfg = NULL;
    xce_result r = xce_receiver_config_new(&cfg);
    if (r != XCE_OK) die_lib("config", r);
    if ((r = xce_receiver_config_add_listen(cfg, addr)) != XCE_OK) die_lib("listen address", r);
    if (insecure) {
        fprintf(stderr, "xce-controller-example: WARNING: --insecure: plaintext, no identity\n");
        r = xce_receiver_config_set_insecure_plaintext(cfg);
    } else {
        r = xce_receiver_config_set_tls(cfg, ca, cert, key, crl);
    }
    if (r != XCE_OK) die_lib("tls", r);
    for (size_t i = 0; i < ndomains; i++)
        if ((r = xce_receiver_config_add_domain(cfg, domains[i])) != XCE_OK) die_lib("--domain", r);
    if (heartbeat_ms && (r = xce_receiver_config_set_agent_heartbeat_ms(cfg, heartbeat_ms)) != XCE_OK)
        die_lib("--agent-heartbeat-ms", r);
    if (queue && (r = xce_receiver_config_set_queue_capacity(cfg, queue)) != XCE_OK)
        die_lib("--queue", r);
    /* Warnings and errors: what an operator needs to know why a host was cut off. */
    if ((r = xce_receiver_config_set_log(cfg, on_log, NULL, XCE_LOG_WARN)) != XCE_OK)
        die_lib("log", r);

    xce_receiver *rx = NULL;
    r = xce_receiver_start(cfg, &rx);
    xce_receiver_config_free(cfg);
    if (r != XCE_OK) die_lib("start", r);

    for (size_t i = 0; i < nassigns; i++) {
        /* HOST=NAME@INSTANCE */
        char *spec = dup_str(assigns[i]);
        char *eq = strchr(spec, '='), *at = eq ? strchr(eq, '@') : NULL;
        if (!eq || !at) {
            free(spec);
            usage();
        }
        *eq = '\0';
        *at = '\0';
        xce_instance inst = {.name = eq + 1, .instance = at + 1};
        r = xce_receiver_assign(rx, spec, &inst, 1);
        free(spec);
        if (r != XCE_OK) die_lib("--assign", r);
    }

    char bound[64];
    if ((r = xce_receiver_local_addr(rx, 0, bound, sizeof bound)) != XCE_OK) die_lib("local address", r);
    /* The library that was loaded, which may be newer than the header compiled against. */
    xce_version v = xce_receiver_version();
    fprintf(stderr, "xce-controller-example: libxce_receiver %s (agent protocol %u to %u)\n",
            v.library, (unsigned)v.protocol_min, (unsigned)v.protocol_max);
    fprintf(stderr, "xce-controller-example: listening on %s\n", bound);

    if (pipe(sig_pipe) != 0) {
        perror("pipe");
        return 3;
    }
    fcntl(sig_pipe[0], F_SETFD, FD_CLOEXEC);
    fcntl(sig_pipe[1], F_SETFD, FD_CLOEXEC);
    fcntl(sig_pipe[1], F_SETFL, O_NONBLOCK);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);

    int fd = -1;
    if ((r = xce_receiver_fd(rx, &fd)) != XCE_OK) die_lib("fd", r);
    setvbuf(stdout, NULL, _IOLBF, 0);

    int running = 1;
    while (running) {
        struct pollfd pfd[2] = {{.fd = fd, .events = POLLIN}, {.fd = sig_pipe[0], .events = POLLIN}};
        if (poll(pfd, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            perror("poll");
            break;
        }
        if (pfd[1].revents & POLLIN) {
            unsigned char sig = 0;
            if (read(sig_pipe[0], &sig, 1) == 1) {
                if (sig == SIGUSR1)
                    print_table(rx);
                else
                    running = 0;
            }
        }
        if (pfd[0].revents & POLLIN) {
            xce_event *ev = NULL;
            /* A bounded batch per wake-up, so a signal is never kept waiting. */
            for (int n = 0; n < 256 && (r = xce_receiver_pop(rx, &ev)) == XCE_OK; n++) {
                handle(ev);
                xce_event_free(ev);
            }
            if (r != XCE_OK && r != XCE_EMPTY) die_lib("pop", r);
        }
    }

    /* Stop: close every agent connection (TLS close_notify), then what was queued. */
    if ((r = xce_receiver_stop(rx)) != XCE_OK) die_lib("stop", r);
    xce_event *ev = NULL;
    while (xce_receiver_pop(rx, &ev) == XCE_OK) {
        handle(ev);
        xce_event_free(ev);
    }
    xce_receiver_free(rx);
    free_hosts();
    close(sig_pipe[0]);
    close(sig_pipe[1]);
    puts("stopped");
    return 0;
}
