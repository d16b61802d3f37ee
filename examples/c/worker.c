/*
 * xce-worker-example: the worker's door on libxce_receiver. xce's worker daemon runs on
 * every node and knows 11 built-in load indices; resource_sync_register_load_index() is its
 * hook for more (the controller research, ../shared/context). This program is that
 * integration in miniature: the agent on the same node feeds it over a unix socket
 * (`controllers: ["unix:/run/xce/worker.sock"]` in agent.yaml), and it
 *   - registers one load index per resource a host declares, on ACCEPTED;
 *   - updates the index on RESVAL;
 *   - marks every index unknown on STALE and on GONE (the agent stopped or died).
 *
 *   xce-worker-example SOCKET [--uid UID]...
 *
 * The socket is made by the library (mode 0666: a peer is known by its uid, SO_PEERCRED;
 * only root, or the --uid given, may feed it). No TLS: the node is the trust boundary.
 * One line per change on stdout:
 *   register NAME[@INSTANCE]
 *   value NAME[@INSTANCE] VALUE
 *   unknown NAME[@INSTANCE] (stale|gone)
 *   refused PEER REASON text="..."
 * SIGTERM/SIGINT stop the receiver, free everything, print "stopped" and exit 0.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "xce_receiver.h"

/* ---- a stand-in for the worker's load-index registry (resource_sync.c) ---- */

struct load_index {
    char *name; /* NAME or NAME@INSTANCE */
    int known;
    double value;
    struct load_index *next;
};

static struct load_index *indices;

static char *dup_label(const char *name, const char *instance) {
    size_t n = strlen(name) + strlen(instance) + 2;
    char *s = malloc(n);
    if (!s) {
        perror("malloc");
        exit(3);
    }
    if (instance[0])
        snprintf(s, n, "%s@%s", name, instance);
    else
        snprintf(s, n, "%s", name);
    return s;
}

static struct load_index *find_index(const char *label) {
    for (struct load_index *i = indices; i; i = i->next)
        if (strcmp(i->name, label) == 0)
            return i;
    return NULL;
}

/* What the worker's resource_sync_register_load_index() does: a named index the worker
 * reports with its built-in ones. Registering a name twice is a no-op. */
static void resource_sync_register_load_index(const char *label) {
    if (find_index(label))
        return;
    struct load_index *i = calloc(1, sizeof *i);
    if (!i) {
        perror("calloc");
        exit(3);
    }
    i->name = strdup(label);
    if (!i->name) {
        perror("strdup");
        exit(3);
    }
    i->next = indices;
    indices = i;
    printf("register %s\n", label);
}

static void mark_all_unknown(const char *why) {
    for (struct load_index *i = indices; i; i = i->next) {
        if (i->known) {
            i->known = 0;
            printf("unknown %s %s\n", i->name, why);
        }
    }
}

static void free_indices(void) {
    while (indices) {
        struct load_index *next = indices->next;
        free(indices->name);
        free(indices);
        indices = next;
    }
}

/* ---- events ---- */

static void handle(const xce_event *ev) {
    switch (ev->kind) {
    case XCE_EVENT_ACCEPTED:
        for (size_t k = 0; k < ev->n_resources; k++) {
            char *label = dup_label(ev->resources[k].name, ev->resources[k].instance);
            resource_sync_register_load_index(label);
            free(label);
        }
        break;
    case XCE_EVENT_RESVAL: {
        char *label = dup_label(ev->name, ev->instance);
        struct load_index *i = find_index(label);
        if (i && ev->value.kind == XCE_VALUE_NUMERIC) {
            i->known = 1;
            i->value = ev->value.numeric;
            printf("value %s %g\n", label, i->value);
        } else if (i && i->known) {
            /* A failed probe past its stale time, or a string: not a load index value. */
            i->known = 0;
            printf("unknown %s not-numeric\n", label);
        }
        free(label);
        break;
    }
    case XCE_EVENT_STALE:
        mark_all_unknown("stale");
        break;
    case XCE_EVENT_GONE:
        mark_all_unknown("gone");
        break;
    case XCE_EVENT_REFUSED:
        printf("refused %s %s text=\"%s\"\n", ev->peer, xce_reason_str((int)ev->reason),
               ev->reason_text);
        break;
    }
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

static void die_lib(const char *what, xce_result r) {
    char msg[1024];
    xce_last_error(msg, sizeof msg, NULL);
    fprintf(stderr, "xce-worker-example: %s: %s: %s\n", what, xce_result_str(r), msg);
    exit(2);
}

int main(int argc, char **argv) {
    if (argc < 2 || argv[1][0] != '/') {
        fputs("usage: xce-worker-example /ABSOLUTE/SOCKET [--uid UID]...\n", stderr);
        return 2;
    }
    const char *path = argv[1];
    xce_receiver_config *cfg = NULL;
    xce_result r = xce_receiver_config_new(&cfg);
    if (r != XCE_OK) die_lib("config", r);
    int uids = 0;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--uid") != 0) {
            fputs("usage: xce-worker-example /ABSOLUTE/SOCKET [--uid UID]...\n", stderr);
            return 2;
        }
        if ((r = xce_receiver_config_add_unix(cfg, path, (uint32_t)strtoul(argv[i + 1], NULL, 10))) != XCE_OK)
            die_lib("--uid", r);
        uids++;
    }
    if (!uids && (r = xce_receiver_config_add_unix(cfg, path, 0)) != XCE_OK)
        die_lib("socket", r);

    xce_receiver *rx = NULL;
    r = xce_receiver_start(cfg, &rx);
    xce_receiver_config_free(cfg);
    if (r != XCE_OK) die_lib("start", r);
    fprintf(stderr, "xce-worker-example: listening on %s\n", path);

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
        if (pfd[1].revents & POLLIN)
            running = 0;
        if (pfd[0].revents & POLLIN) {
            xce_event *ev = NULL;
            for (int n = 0; n < 256 && (r = xce_receiver_pop(rx, &ev)) == XCE_OK; n++) {
                handle(ev);
                xce_event_free(ev);
            }
            if (r != XCE_OK && r != XCE_EMPTY) die_lib("pop", r);
        }
    }
    if ((r = xce_receiver_stop(rx)) != XCE_OK) die_lib("stop", r);
    xce_event *ev = NULL;
    while (xce_receiver_pop(rx, &ev) == XCE_OK) {
        handle(ev);
        xce_event_free(ev);
    }
    xce_receiver_free(rx);
    free_indices();
    close(sig_pipe[0]);
    close(sig_pipe[1]);
    unlink(path);
    puts("stopped");
    return 0;
}
