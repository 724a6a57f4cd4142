/*
 * pw-workload: the one program in the real node's workload image
 * (tests/node/start builds it static, FROM scratch). A colocated Service's
 * pods must be real containers that serve some ports and not others, stay
 * up while terminating, and fail readiness on demand; a client pod must
 * show whom a ClusterIP reaches. busybox alone cannot (its static wget
 * crashes, its httpd ignores SIGTERM), so this is that, and no more.
 *
 *   pw-workload serve NAME [--drain SECONDS] PORT...
 *       Listen on every PORT (IPv4 and IPv6); each connection gets "NAME\n"
 *       and is closed. On SIGTERM, keep serving for SECONDS (default 0),
 *       the way a well-behaved server drains, then exit 0.
 *   pw-workload ready
 *       Exit 0 unless /unready exists: an exec readiness probe that a
 *       test fails with `kubectl exec POD -- pw-workload unready`.
 *   pw-workload unready | pw-workload recover
 *       Create or remove /unready (the image has no /tmp).
 *   pw-workload connect HOST PORT COUNT TIMEOUT_MS [INTERVAL_MS]
 *       COUNT connections, one line each: "ok NAME", "refused" or
 *       "failed WHY" (the format of tests/src/consumers.rs's clients),
 *       INTERVAL_MS apart (default 0): traffic across an upgrade.
 *   pw-workload sleep
 *       Sleep until SIGTERM (a client pod's main process).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define UNREADY "/unready"
#define MAX_PORTS 16

static volatile sig_atomic_t terminated;
static void on_term(int sig) { (void)sig; terminated = 1; }

static int listen_on(int port) {
	int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
	int off = 0, on = 1;
	struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_port = htons(port), .sin6_addr = in6addr_any};
	if (fd < 0) return -1;
	/* One dual-stack socket: IPv4 connections arrive as mapped addresses. */
	setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
	if (bind(fd, (struct sockaddr *)&a, sizeof a) < 0 || listen(fd, 128) < 0) {
		fprintf(stderr, "pw-workload: port %d: %s\n", port, strerror(errno));
		close(fd);
		return -1;
	}
	return fd;
}

static double now_s(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static int serve(int argc, char **argv) {
	struct pollfd fds[MAX_PORTS];
	int n = 0, drain = 0;
	const char *name;
	char reply[256];
	double deadline = 0;
	if (argc < 2) return 2;
	name = argv[0];
	argv++, argc--;
	if (argc >= 2 && strcmp(argv[0], "--drain") == 0) {
		drain = atoi(argv[1]);
		argv += 2, argc -= 2;
	}
	snprintf(reply, sizeof reply, "%s\n", name);
	for (int i = 0; i < argc && n < MAX_PORTS; i++) {
		int fd = listen_on(atoi(argv[i]));
		if (fd < 0) return 1;
		fds[n].fd = fd, fds[n].events = POLLIN, n++;
	}
	struct sigaction sa = {.sa_handler = on_term};
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	fprintf(stderr, "pw-workload: %s serving %d port(s)\n", name, n);
	for (;;) {
		if (terminated && deadline == 0) {
			fprintf(stderr, "pw-workload: SIGTERM, draining for %d s\n", drain);
			deadline = now_s() + drain;
		}
		if (deadline != 0 && now_s() >= deadline) return 0;
		if (poll(fds, n, 100) <= 0) continue;
		for (int i = 0; i < n; i++) {
			if (!(fds[i].revents & POLLIN)) continue;
			int c = accept4(fds[i].fd, NULL, NULL, SOCK_CLOEXEC);
			if (c < 0) continue;
			(void)!write(c, reply, strlen(reply));
			close(c);
		}
	}
}

static int connect_to(int argc, char **argv) {
	if (argc != 4 && argc != 5) return 2;
	const char *host = argv[0];
	int port = atoi(argv[1]), count = atoi(argv[2]), timeout_ms = atoi(argv[3]);
	int interval_ms = argc == 5 ? atoi(argv[4]) : 0;
	struct sockaddr_storage ss = {0};
	socklen_t len;
	struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
	struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
	if (inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
		a4->sin_family = AF_INET, a4->sin_port = htons(port), len = sizeof *a4;
	} else if (inet_pton(AF_INET6, host, &a6->sin6_addr) == 1) {
		a6->sin6_family = AF_INET6, a6->sin6_port = htons(port), len = sizeof *a6;
	} else {
		fprintf(stderr, "pw-workload: %s is not an IP address\n", host);
		return 2;
	}
	struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
	for (int i = 0; i < count; i++) {
		if (i > 0 && interval_ms > 0) usleep(interval_ms * 1000);
		int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
		char buf[256];
		size_t got = 0;
		setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
		setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
		if (connect(fd, (struct sockaddr *)&ss, len) < 0) {
			if (errno == ECONNREFUSED) printf("refused\n");
			else printf("failed %s\n", strerrorname_np(errno) ? strerrorname_np(errno) : "connect");
			close(fd);
			fflush(stdout);
			continue;
		}
		for (;;) {
			ssize_t r = read(fd, buf + got, sizeof buf - 1 - got);
			if (r <= 0) break;
			got += r;
			if (got == sizeof buf - 1) break;
		}
		buf[got] = 0;
		buf[strcspn(buf, "\r\n")] = 0;
		if (got == 0) printf("failed empty reply\n");
		else printf("ok %s\n", buf);
		fflush(stdout);
		close(fd);
	}
	return 0;
}

int main(int argc, char **argv) {
	const char *cmd = argc > 1 ? argv[1] : "";
	if (strcmp(cmd, "serve") == 0) return serve(argc - 2, argv + 2);
	if (strcmp(cmd, "connect") == 0) return connect_to(argc - 2, argv + 2);
	if (strcmp(cmd, "ready") == 0) return access(UNREADY, F_OK) == 0 ? 1 : 0;
	if (strcmp(cmd, "unready") == 0) return close(open(UNREADY, O_CREAT | O_WRONLY, 0644)) == 0 ? 0 : 1;
	if (strcmp(cmd, "recover") == 0) return unlink(UNREADY) == 0 || errno == ENOENT ? 0 : 1;
	if (strcmp(cmd, "sleep") == 0) {
		signal(SIGTERM, on_term);
		while (!terminated) pause();
		return 0;
	}
	fprintf(stderr, "usage: pw-workload serve NAME [--drain S] PORT... | ready | unready | recover | connect HOST PORT COUNT TIMEOUT_MS [INTERVAL_MS] | sleep\n");
	return 2;
}
