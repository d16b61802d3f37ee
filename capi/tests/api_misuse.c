/*
 * Every function of libxce_receiver with a NULL or misused argument returns an error code
 * and never crashes. Built and run (also under valgrind) by tests/it/capi.rs; prints
 * "api_misuse: N checks passed" and exits 0, or names the first failed check and exits 1.
 */
#define _POSIX_C_SOURCE 200809L
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "xce_receiver.h"

static int checks;

#define EXPECT(call, want)                                                              \
    do {                                                                                \
        xce_result got_ = (call);                                                       \
        checks++;                                                                       \
        if (got_ != (want)) {                                                           \
            char msg_[512];                                                             \
            xce_last_error(msg_, sizeof msg_, NULL);                                    \
            fprintf(stderr, "api_misuse: line %d: %s returned %s, expected %s (%s)\n",  \
                    __LINE__, #call, xce_result_str(got_), xce_result_str(want), msg_); \
            return 1;                                                                   \
        }                                                                               \
    } while (0)

/* What the log callback saw: it runs on the library's thread, so the count is atomic and
 * published after the line is copied. */
struct log_seen {
    atomic_int calls;
    atomic_int bad;
    char last[1100];
};

static void on_log(void *userdata, xce_log_level level, const char *message, size_t len) {
    struct log_seen *seen = userdata;
    if (level < XCE_LOG_ERROR || level > XCE_LOG_WARN || strlen(message) != len || len > 1024)
        atomic_fetch_add(&seen->bad, 1);
    memcpy(seen->last, message, len + 1);
    atomic_fetch_add_explicit(&seen->calls, 1, memory_order_release);
}

/* Send an HTTP request where a hello belongs to `addr` ("127.0.0.1:PORT") and wait for the
 * receiver to hang up (it logs before it does). 0 on success. */
static int garbage_peer(const char *addr) {
    const char *colon = strrchr(addr, ':');
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0 || connect(s, (struct sockaddr *)&sin, sizeof sin) != 0)
        return -1;
    static const char request[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    if (write(s, request, sizeof request - 1) != (ssize_t)(sizeof request - 1))
        return -1;
    char sink[256];
    while (read(s, sink, sizeof sink) > 0) {
    }
    close(s);
    return 0;
}

int main(void) {
    char buf[256];
    size_t needed = 0;
    int fd = -1;
    xce_event *ev = NULL;
    xce_event **evs = NULL;
    size_t n = 0;
    xce_receiver_config *cfg = NULL;
    xce_receiver *rx = NULL;

    /* NULL where a pointer is required, object by object. */
    EXPECT(xce_receiver_config_new(NULL), XCE_NULL_ARGUMENT);
    EXPECT(xce_receiver_config_free(NULL), XCE_NULL_ARGUMENT);
    EXPECT(xce_receiver_config_add_listen(NULL, "127.0.0.1:0"), XCE_NULL_ARGUMENT);
    EXPECT(xce_receiver_config_set_tls(NULL, "a", "b", "c", NULL), XCE_NULL_ARGUMENT);
    EXPECT(xce_receiver_config_set_insecure_plaintext(NULL), XCE_NULL_ARGUMENT);
    EXPECT(xce_receiver_config_set_queue_capacity(NULL, 1), XCE_NULL_ARGUMENT);
    EXPECT(xce_receiver_config_set_agent_heartbeat_ms(NULL, 1), XCE_NULL_ARGUMENT);
    EXPECT(xce_receiver_config_set_ack(NULL, true), XCE_NULL_ARGUMENT);
    EXPECT(xce_receiver_config_add_domain(NULL, "cluster.example"), XCE_NULL_ARGUMENT);
    EXPECT(xce_receiver_start(NULL, &rx), XCE_NULL_ARGUMENT);
    EXPECT(xce_receiver_fd(NULL, &fd), XCE_NULL_ARGUMENT);
    EXPECT(xce_receiver_local_addr(NULL, 0, buf, sizeof buf), XCE_NULL_ARGUMENT);
    EXPECT(xce_receiver_pop(NULL, &ev), XCE_NULL_ARGUMENT);
    EXPECT(xce_event_free(NULL), XCE_NULL_ARGUMENT);
    EXPECT(xce_receiver_assign(NULL, "node001", NULL, 0), XCE_NULL_ARGUMENT);
    EXPECT(xce_receiver_snapshot(NULL, NULL, &evs, &n), XCE_NULL_ARGUMENT);
    EXPECT(xce_events_free(NULL, 0), XCE_NULL_ARGUMENT);
    EXPECT(xce_receiver_stop(NULL), XCE_NULL_ARGUMENT);
    EXPECT(xce_receiver_free(NULL), XCE_NULL_ARGUMENT);
    EXPECT(xce_last_error(NULL, 10, NULL), XCE_NULL_ARGUMENT);
    EXPECT(xce_receiver_config_set_log(NULL, on_log, NULL, XCE_LOG_WARN), XCE_NULL_ARGUMENT);
    if (strcmp(xce_result_str(12345), "unknown result") != 0 || strcmp(xce_reason_str(-1), "unknown") != 0) {
        fprintf(stderr, "api_misuse: the *_str functions do not name unknown codes\n");
        return 1;
    }

    /* A configuration: NULL and misused arguments. */
    EXPECT(xce_receiver_config_new(&cfg), XCE_OK);
    EXPECT(xce_receiver_config_add_listen(cfg, NULL), XCE_NULL_ARGUMENT);
    EXPECT(xce_receiver_config_add_listen(cfg, ""), XCE_INVALID_ARGUMENT);
    EXPECT(xce_receiver_config_add_listen(cfg, "\xff\xfe"), XCE_INVALID_ARGUMENT);
    EXPECT(xce_receiver_config_set_tls(cfg, NULL, "b", "c", NULL), XCE_NULL_ARGUMENT);
    EXPECT(xce_receiver_config_set_tls(cfg, "a", NULL, "c", NULL), XCE_NULL_ARGUMENT);
    EXPECT(xce_receiver_config_set_tls(cfg, "a", "b", NULL, NULL), XCE_NULL_ARGUMENT);
    EXPECT(xce_receiver_config_add_domain(cfg, NULL), XCE_NULL_ARGUMENT);
    EXPECT(xce_receiver_config_add_domain(cfg, ""), XCE_INVALID_ARGUMENT);
    EXPECT(xce_receiver_config_add_domain(cfg, "not a domain"), XCE_INVALID_ARGUMENT);
    EXPECT(xce_receiver_config_add_domain(cfg, "cluster.example"), XCE_OK);
    EXPECT(xce_receiver_config_set_queue_capacity(cfg, 0), XCE_INVALID_ARGUMENT);
    EXPECT(xce_receiver_config_set_log(cfg, on_log, NULL, 0), XCE_INVALID_ARGUMENT);
    EXPECT(xce_receiver_config_set_log(cfg, on_log, NULL, XCE_LOG_TRACE + 1), XCE_INVALID_ARGUMENT);
    /* A NULL callback turns the log off. */
    EXPECT(xce_receiver_config_set_log(cfg, NULL, NULL, XCE_LOG_TRACE), XCE_OK);
    EXPECT(xce_receiver_config_set_agent_heartbeat_ms(cfg, 0), XCE_INVALID_ARGUMENT);
    EXPECT(xce_receiver_config_set_agent_heartbeat_ms(cfg, 86400001ULL), XCE_INVALID_ARGUMENT);
    EXPECT(xce_receiver_start(cfg, NULL), XCE_NULL_ARGUMENT);
    /* No address yet. */
    EXPECT(xce_receiver_start(cfg, &rx), XCE_CONFIG);
    xce_last_error(buf, sizeof buf, &needed);
    if (!strstr(buf, "no listen address") || needed != strlen(buf) + 1) {
        fprintf(stderr, "api_misuse: last error %s (needed %zu)\n", buf, needed);
        return 1;
    }
    /* A short buffer is cut and NUL-terminated. */
    EXPECT(xce_last_error(buf, 4, &needed), XCE_BUFFER_TOO_SMALL);
    if (strlen(buf) != 3) {
        fprintf(stderr, "api_misuse: a cut error is not NUL-terminated\n");
        return 1;
    }
    EXPECT(xce_receiver_config_add_listen(cfg, "127.0.0.1:0"), XCE_OK);
    /* Neither TLS nor plaintext said in words. */
    EXPECT(xce_receiver_start(cfg, &rx), XCE_CONFIG);
    /* TLS files that do not exist. */
    EXPECT(xce_receiver_config_set_tls(cfg, "/nonexistent/ca.pem", "/nonexistent/c.pem", "/nonexistent/k.pem", NULL), XCE_OK);
    EXPECT(xce_receiver_start(cfg, &rx), XCE_TLS);
    /* Both TLS and plaintext. */
    EXPECT(xce_receiver_config_set_insecure_plaintext(cfg), XCE_OK);
    EXPECT(xce_receiver_start(cfg, &rx), XCE_CONFIG);
    EXPECT(xce_receiver_config_free(cfg), XCE_OK);

    /* An address that cannot be bound. */
    EXPECT(xce_receiver_config_new(&cfg), XCE_OK);
    EXPECT(xce_receiver_config_set_insecure_plaintext(cfg), XCE_OK);
    EXPECT(xce_receiver_config_add_listen(cfg, "not an address"), XCE_OK);
    EXPECT(xce_receiver_start(cfg, &rx), XCE_BIND);
    EXPECT(xce_receiver_config_free(cfg), XCE_OK);

    /* A running receiver: NULL and misused arguments. */
    static struct log_seen seen;
    EXPECT(xce_receiver_config_new(&cfg), XCE_OK);
    EXPECT(xce_receiver_config_set_insecure_plaintext(cfg), XCE_OK);
    EXPECT(xce_receiver_config_add_listen(cfg, "127.0.0.1:0"), XCE_OK);
    EXPECT(xce_receiver_config_set_log(cfg, on_log, &seen, XCE_LOG_WARN), XCE_OK);
    EXPECT(xce_receiver_start(cfg, &rx), XCE_OK);
    EXPECT(xce_receiver_config_free(cfg), XCE_OK);
    EXPECT(xce_receiver_fd(rx, NULL), XCE_NULL_ARGUMENT);
    EXPECT(xce_receiver_fd(rx, &fd), XCE_OK);
    EXPECT(xce_receiver_local_addr(rx, 0, NULL, 10), XCE_NULL_ARGUMENT);
    EXPECT(xce_receiver_local_addr(rx, 0, buf, 0), XCE_BUFFER_TOO_SMALL);
    EXPECT(xce_receiver_local_addr(rx, 0, buf, 4), XCE_BUFFER_TOO_SMALL);
    EXPECT(xce_receiver_local_addr(rx, 1, buf, sizeof buf), XCE_NOT_FOUND);
    EXPECT(xce_receiver_local_addr(rx, 0, buf, sizeof buf), XCE_OK);
    EXPECT(xce_receiver_pop(rx, NULL), XCE_NULL_ARGUMENT);
    EXPECT(xce_receiver_pop(rx, &ev), XCE_EMPTY);
    if (ev != NULL) {
        fprintf(stderr, "api_misuse: an empty pop left *ev set\n");
        return 1;
    }
    xce_instance good = {.name = "license", .instance = "all"};
    xce_instance null_name = {.name = NULL, .instance = "all"};
    xce_instance bad_name = {.name = "9lives\n", .instance = "all"};
    EXPECT(xce_receiver_assign(rx, NULL, &good, 1), XCE_NULL_ARGUMENT);
    EXPECT(xce_receiver_assign(rx, "node001", NULL, 1), XCE_NULL_ARGUMENT);
    EXPECT(xce_receiver_assign(rx, "node001", &null_name, 1), XCE_NULL_ARGUMENT);
    EXPECT(xce_receiver_assign(rx, "node001", &bad_name, 1), XCE_INVALID_ARGUMENT);
    EXPECT(xce_receiver_assign(rx, "bad host\n", &good, 1), XCE_INVALID_ARGUMENT);
    EXPECT(xce_receiver_assign(rx, "node001", NULL, 100000000), XCE_NULL_ARGUMENT);
    EXPECT(xce_receiver_assign(rx, "node001", &good, 100000000), XCE_INVALID_ARGUMENT);
    EXPECT(xce_receiver_assign(rx, "node001", &good, 1), XCE_OK);
    EXPECT(xce_receiver_assign(rx, "node001", NULL, 0), XCE_OK);
    EXPECT(xce_receiver_snapshot(rx, NULL, NULL, &n), XCE_NULL_ARGUMENT);
    EXPECT(xce_receiver_snapshot(rx, NULL, &evs, NULL), XCE_NULL_ARGUMENT);
    EXPECT(xce_receiver_snapshot(rx, "node001", &evs, &n), XCE_NOT_FOUND);
    EXPECT(xce_receiver_snapshot(rx, NULL, &evs, &n), XCE_OK);
    if (evs != NULL || n != 0) {
        fprintf(stderr, "api_misuse: a snapshot of no hosts is not empty\n");
        return 1;
    }
    /* A peer that sends garbage: the controller's log callback hears why it was dropped. */
    int calls_before = atomic_load(&seen.calls);
    EXPECT(xce_receiver_local_addr(rx, 0, buf, sizeof buf), XCE_OK);
    if (garbage_peer(buf) != 0) {
        fprintf(stderr, "api_misuse: cannot reach the receiver at %s\n", buf);
        return 1;
    }
    if (atomic_load_explicit(&seen.calls, memory_order_acquire) <= calls_before ||
        atomic_load(&seen.bad) != 0 || !strstr(seen.last, "dropping agent connection")) {
        fprintf(stderr, "api_misuse: log: %d calls (%d bad), last %s\n", atomic_load(&seen.calls),
                atomic_load(&seen.bad), seen.last);
        return 1;
    }
    /* ... and the controller gets it as a REFUSED event. */
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    if (poll(&pfd, 1, 60000) != 1) {
        fprintf(stderr, "api_misuse: no event for the garbage peer\n");
        return 1;
    }
    EXPECT(xce_receiver_pop(rx, &ev), XCE_OK);
    if (ev->kind != XCE_EVENT_REFUSED) {
        fprintf(stderr, "api_misuse: the garbage peer's event is kind %d\n", (int)ev->kind);
        return 1;
    }
    EXPECT(xce_event_free(ev), XCE_OK);
    ev = NULL;
    EXPECT(xce_receiver_stop(rx), XCE_OK);
    EXPECT(xce_receiver_stop(rx), XCE_OK);
    EXPECT(xce_receiver_assign(rx, "node001", &good, 1), XCE_STOPPED);
    EXPECT(xce_receiver_pop(rx, &ev), XCE_EMPTY);
    EXPECT(xce_receiver_free(rx), XCE_OK);

    printf("api_misuse: %d checks passed\n", checks);
    return 0;
}
