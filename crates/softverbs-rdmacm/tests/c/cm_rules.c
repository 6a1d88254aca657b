/* The rdma_cm rules the man pages state, checked through the drop-in librdmacm.so.1.
 *
 *   cm_rules SCENARIO SERVER_OCTET CLIENT_OCTET PORT
 *
 * Two-process scenarios fork: the parent is the server (device 127.0.0.SERVER_OCTET),
 * the child the client (127.0.0.CLIENT_OCTET); each sets SOFTVERBS_ADDR before its first
 * verbs call. Every wait is bounded (WAIT_MS). Prints "ok SCENARIO" and exits 0 on
 * success; any failed check prints "FAIL ..." and exits 1.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <rdma/rdma_cma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define WAIT_MS 60000

static const char *scenario;

#define CHECK(cond)                                                                   \
	do {                                                                          \
		if (!(cond)) {                                                        \
			fprintf(stderr, "FAIL %s (%s:%d, pid %d): %s (errno %d %s)\n", \
				scenario, __FILE__, __LINE__, (int)getpid(), #cond,   \
				errno, strerror(errno));                              \
			exit(1);                                                      \
		}                                                                     \
	} while (0)

static void set_addr(int octet)
{
	char buf[64];
	snprintf(buf, sizeof buf, "127.0.0.%d:4791", octet);
	setenv("SOFTVERBS_ADDR", buf, 1);
}

static struct sockaddr_in sin_of(int octet, int port)
{
	struct sockaddr_in s;
	char ip[32];
	memset(&s, 0, sizeof s);
	s.sin_family = AF_INET;
	s.sin_port = htons(port);
	snprintf(ip, sizeof ip, "127.0.0.%d", octet);
	inet_pton(AF_INET, ip, &s.sin_addr);
	return s;
}

/* Waits (bounded) for the next event and checks its type. */
static struct rdma_cm_event *expect(struct rdma_event_channel *ch, enum rdma_cm_event_type want)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	struct rdma_cm_event *e = NULL;
	CHECK(poll(&p, 1, WAIT_MS) == 1);
	CHECK(rdma_get_cm_event(ch, &e) == 0);
	if (e->event != want) {
		fprintf(stderr, "FAIL %s: got %s (status %d), wanted %s\n", scenario,
			rdma_event_str(e->event), e->status, rdma_event_str(want));
		exit(1);
	}
	return e;
}

static void qp_attr(struct ibv_qp_init_attr *a)
{
	memset(a, 0, sizeof *a);
	a->cap.max_send_wr = a->cap.max_recv_wr = 4;
	a->cap.max_send_sge = a->cap.max_recv_sge = 1;
	a->qp_type = IBV_QPT_RC;
}

/* The client: resolve, QP, connect with private data; returns the id (event channel in
 * *chp) after the connect call. */
static struct rdma_cm_id *client_connect(int server, int port, struct rdma_event_channel **chp)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id;
	struct sockaddr_in dst = sin_of(server, port);
	struct ibv_qp_init_attr a;
	struct rdma_conn_param p;
	CHECK(ch);
	CHECK(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000) == 0);
	CHECK(rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED)) == 0);
	CHECK(rdma_resolve_route(id, 2000) == 0);
	CHECK(rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED)) == 0);
	qp_attr(&a);
	CHECK(rdma_create_qp(id, NULL, &a) == 0);
	memset(&p, 0, sizeof p);
	p.private_data = "hello";
	p.private_data_len = 6;
	p.responder_resources = 1;
	p.initiator_depth = 1;
	p.retry_count = 7;
	p.rnr_retry_count = 7;
	CHECK(rdma_connect(id, &p) == 0);
	*chp = ch;
	return id;
}

static void client_close(struct rdma_cm_id *id, struct rdma_event_channel *ch)
{
	rdma_destroy_qp(id);
	CHECK(rdma_destroy_id(id) == 0);
	rdma_destroy_event_channel(ch);
}

/* Waits (bounded) for the child and checks that it exited with status 0. */
static void reap(pid_t child)
{
	int status = 0, i;
	for (i = 0; i < WAIT_MS / 10; i++) {
		if (waitpid(child, &status, WNOHANG) == child)
			break;
		usleep(10000);
	}
	CHECK(i < WAIT_MS / 10);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* The server side of a two-process scenario: listen, tell the child, run `serve`, reap
 * the child (bounded) and pass its status on. */
static int server_main(int server, int port, int ready_fd, pid_t child,
		       void (*serve)(struct rdma_event_channel *, struct rdma_cm_id *))
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *listen;
	struct sockaddr_in a = sin_of(server, port);
	CHECK(ch);
	CHECK(rdma_create_id(ch, &listen, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_bind_addr(listen, (struct sockaddr *)&a) == 0);
	CHECK(rdma_listen(listen, 4) == 0);
	CHECK(write(ready_fd, "r", 1) == 1);
	if (serve)
		serve(ch, listen);
	reap(child);
	CHECK(rdma_destroy_id(listen) == 0);
	rdma_destroy_event_channel(ch);
	return 0;
}

static void serve_reject(struct rdma_event_channel *ch, struct rdma_cm_id *listen)
{
	struct rdma_cm_event *e = expect(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
	struct rdma_cm_id *id = e->id;
	CHECK(e->listen_id == listen);
	CHECK(e->param.conn.private_data_len >= 6);
	CHECK(memcmp(e->param.conn.private_data, "hello", 6) == 0);
	CHECK(rdma_reject(id, "not today", 10) == 0);
	CHECK(rdma_ack_cm_event(e) == 0);
	CHECK(rdma_destroy_id(id) == 0);
}

static void client_reject(int server, int port)
{
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id = client_connect(server, port, &ch);
	struct rdma_cm_event *e = expect(ch, RDMA_CM_EVENT_REJECTED);
	/* rdma_reject(3): the private data reaches the peer with the REJECTED event; the
	 * status is the IB CM reject reason, 28 (consumer reject). */
	CHECK(e->status == 28);
	CHECK(e->param.conn.private_data_len >= 10);
	CHECK(memcmp(e->param.conn.private_data, "not today", 10) == 0);
	CHECK(rdma_ack_cm_event(e) == 0);
	client_close(id, ch);
}

static void client_no_listener(int server, int port)
{
	struct rdma_event_channel *ch;
	/* Nobody listens on port + 1: the peer's CM answers REJ reason 8 (invalid service
	 * ID), which the kernel over RoCE reports as REJECTED with status 8. */
	struct rdma_cm_id *id = client_connect(server, port + 1, &ch);
	struct rdma_cm_event *e = expect(ch, RDMA_CM_EVENT_REJECTED);
	CHECK(e->status == 8);
	/* rdma_get_cm_event(3): the event's id is the connecting id; listen_id is only set
	 * for connection requests. */
	CHECK(e->id == id && e->listen_id == NULL);
	CHECK(rdma_ack_cm_event(e) == 0);
	client_close(id, ch);
}

static int passive_disconnects;

static void serve_connected(struct rdma_event_channel *ch, struct rdma_cm_id *listen)
{
	struct rdma_cm_event *e = expect(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
	struct rdma_cm_id *id = e->id;
	struct ibv_qp_init_attr a;
	struct rdma_conn_param p;
	(void)listen;
	CHECK(rdma_ack_cm_event(e) == 0);
	qp_attr(&a);
	CHECK(rdma_create_qp(id, NULL, &a) == 0);
	memset(&p, 0, sizeof p);
	p.responder_resources = 1;
	p.initiator_depth = 1;
	p.rnr_retry_count = 7;
	CHECK(rdma_accept(id, &p) == 0);
	CHECK(rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ESTABLISHED)) == 0);
	if (passive_disconnects) {
		CHECK(rdma_disconnect(id) == 0);
		CHECK(rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_DISCONNECTED)) == 0);
	} else {
		CHECK(rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_DISCONNECTED)) == 0);
		CHECK(rdma_disconnect(id) == 0); /* answers the DREQ */
	}
	rdma_destroy_qp(id);
	CHECK(rdma_destroy_id(id) == 0);
}

static void client_connected(int server, int port)
{
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id = client_connect(server, port, &ch);
	struct rdma_cm_event *e = expect(ch, RDMA_CM_EVENT_ESTABLISHED);
	CHECK(rdma_ack_cm_event(e) == 0);
	if (passive_disconnects) {
		CHECK(rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_DISCONNECTED)) == 0);
		CHECK(rdma_disconnect(id) == 0);
	} else {
		CHECK(rdma_disconnect(id) == 0);
		CHECK(rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_DISCONNECTED)) == 0);
	}
	client_close(id, ch);
}

static int two_process(int server, int client, int port,
		       void (*serve)(struct rdma_event_channel *, struct rdma_cm_id *),
		       void (*run_client)(int, int))
{
	int fds[2];
	pid_t pid;
	char c;
	CHECK(pipe(fds) == 0);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		struct pollfd p = { .fd = fds[0], .events = POLLIN };
		close(fds[1]);
		set_addr(client);
		CHECK(poll(&p, 1, WAIT_MS) == 1);
		CHECK(read(fds[0], &c, 1) == 1);
		run_client(server, port);
		exit(0);
	}
	close(fds[0]);
	set_addr(server);
	return server_main(server, port, fds[1], pid, serve);
}

static volatile int destroyed;

static void *destroy_thread(void *id)
{
	int r = rdma_destroy_id(id);
	destroyed = r == 0 ? 1 : -1;
	return NULL;
}

/* rdma_destroy_id(3): "Users must ... ack all related events" before it returns;
 * librdmacm blocks until they are. */
static void destroy_waits_for_ack(int own)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id;
	struct sockaddr_in dst = sin_of(own, 7000);
	struct rdma_cm_event *e;
	pthread_t t;
	int i;
	set_addr(own);
	CHECK(ch);
	CHECK(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000) == 0);
	e = expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED);
	CHECK(pthread_create(&t, NULL, destroy_thread, id) == 0);
	usleep(300000);
	CHECK(destroyed == 0); /* still blocked: the event is not acknowledged */
	CHECK(rdma_ack_cm_event(e) == 0);
	for (i = 0; i < WAIT_MS / 10 && !destroyed; i++)
		usleep(10000);
	CHECK(destroyed == 1);
	CHECK(pthread_join(t, NULL) == 0);
	rdma_destroy_event_channel(ch);
}

/* rdma_get_cm_event(3): on a channel whose fd was made non-blocking, the call fails
 * with EAGAIN when no event waits, and the fd polls readable when one does. */
static void nonblocking_channel(int own)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id;
	struct sockaddr_in dst = sin_of(own, 7000);
	struct rdma_cm_event *e = NULL;
	struct pollfd p;
	set_addr(own);
	CHECK(ch);
	CHECK(fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK) == 0);
	errno = 0;
	CHECK(rdma_get_cm_event(ch, &e) == -1 && errno == EAGAIN);
	CHECK(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000) == 0);
	p.fd = ch->fd;
	p.events = POLLIN;
	CHECK(poll(&p, 1, WAIT_MS) == 1);
	CHECK(rdma_get_cm_event(ch, &e) == 0);
	CHECK(e->event == RDMA_CM_EVENT_ADDR_RESOLVED && e->id == id && e->status == 0);
	CHECK(rdma_ack_cm_event(e) == 0);
	errno = 0;
	CHECK(rdma_get_cm_event(ch, &e) == -1 && errno == EAGAIN);
	CHECK(rdma_destroy_id(id) == 0);
	rdma_destroy_event_channel(ch);
}

/* Bad arguments fail with -1 and the errno the man pages give, never a crash. */
static void bad_arguments(int own)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id;
	struct rdma_cm_event *e;
	struct sockaddr_in6 ib;
	int bogus[64] = { 0 };
	set_addr(own);
	CHECK(ch);
	errno = 0;
	CHECK(rdma_create_id(ch, NULL, NULL, RDMA_PS_TCP) == -1 && errno == EINVAL);
	CHECK(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0);
	errno = 0;
	CHECK(rdma_get_cm_event(NULL, &e) == -1 && errno == EINVAL);
	errno = 0;
	CHECK(rdma_ack_cm_event((struct rdma_cm_event *)bogus) == -1 && errno == EINVAL);
	errno = 0;
	CHECK(rdma_destroy_id((struct rdma_cm_id *)bogus) == -1 && errno == EINVAL);
	errno = 0;
	CHECK(rdma_resolve_route(id, 1000) == -1 && errno == EINVAL);
	memset(&ib, 0, sizeof ib);
	ib.sin6_family = 27; /* AF_IB */
	errno = 0;
	CHECK(rdma_bind_addr(id, (struct sockaddr *)&ib) == -1 && errno == EAFNOSUPPORT);
	errno = 0;
	CHECK(rdma_connect(id, NULL) == -1 && errno == EINVAL);
	errno = 0;
	CHECK(rdma_accept(id, NULL) == -1 && errno == EINVAL);
	/* rdma_join_multicast(3) on an id neither bound nor resolved (and not UD): EINVAL, as
	 * the kernel's rdma_join_multicast. */
	struct sockaddr_in group = { .sin_family = AF_INET };
	group.sin_addr.s_addr = htonl(0xefff1401); /* 239.255.20.1 */
	errno = 0;
	CHECK(rdma_join_multicast(id, (struct sockaddr *)&group, NULL) == -1 && errno == EINVAL);
	CHECK(strcmp(rdma_event_str(RDMA_CM_EVENT_REJECTED), "RDMA_CM_EVENT_REJECTED") == 0);
	CHECK(rdma_destroy_id(id) == 0);
	rdma_destroy_event_channel(ch);
}

/* What libfabric's verbs provider relies on: rdma_getaddrinfo(3) with no name resolves
 * the hints' own addresses; rdma_bind_addr(3) to the loopback address binds to the
 * device, with its address as the id's source; rdma_migrate_id(3) of a synchronous id
 * (NULL channel) acknowledges the event the id holds instead of waiting for it. */
static void libfabric_calls(int server)
{
	struct rdma_addrinfo hints, *res = NULL;
	struct sockaddr_in dst = sin_of(server, 7501), lo = sin_of(1, 0), *got;
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id;
	set_addr(server);
	alarm(60);

	memset(&hints, 0, sizeof hints);
	hints.ai_port_space = RDMA_PS_TCP;
	hints.ai_dst_addr = (struct sockaddr *)&dst;
	hints.ai_dst_len = sizeof dst;
	CHECK(rdma_getaddrinfo(NULL, NULL, &hints, &res) == 0);
	CHECK(res && res->ai_dst_addr && res->ai_dst_len == sizeof dst && !res->ai_src_addr);
	CHECK(memcmp(res->ai_dst_addr, &dst, sizeof dst) == 0);
	CHECK(res->ai_family == AF_INET);
	rdma_freeaddrinfo(res);
	memset(&hints, 0, sizeof hints);
	errno = 0;
	CHECK(rdma_getaddrinfo(NULL, NULL, &hints, &res) == -1 && errno == EINVAL);

	CHECK(rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_bind_addr(id, (struct sockaddr *)&lo) == 0);
	CHECK(id->verbs != NULL);
	got = (struct sockaddr_in *)rdma_get_local_addr(id);
	CHECK(got->sin_family == AF_INET && got->sin_addr.s_addr == dst.sin_addr.s_addr);
	CHECK(rdma_destroy_id(id) == 0);

	CHECK(rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000) == 0);
	CHECK(id->event && id->event->event == RDMA_CM_EVENT_ADDR_RESOLVED);
	CHECK((ch = rdma_create_event_channel()) != NULL);
	CHECK(rdma_migrate_id(id, ch) == 0);
	CHECK(id->channel == ch);
	CHECK(rdma_resolve_route(id, 2000) == 0);
	CHECK(rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED)) == 0);
	CHECK(rdma_destroy_id(id) == 0);
	rdma_destroy_event_channel(ch);
	alarm(0);
}

/* A request that reaches the server before its rdma_listen (the CM holds it a while
 * for the listen, as programs that connect right after telling their peer to listen need)
 * is the listener's as soon as rdma_listen returns: its CONNECT_REQUEST comes at once, not
 * when the hold runs out (50 ms after the request came). */
#define LISTEN_AFTER_REQUEST_BOUND_MS 30

static void listen_after_request(int server, int client, int port)
{
	int go[2], sent[2];
	struct pollfd p;
	pid_t pid;
	char c;
	CHECK(pipe(go) == 0 && pipe(sent) == 0);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		struct rdma_event_channel *ch;
		struct rdma_cm_id *id;
		struct rdma_cm_event *e;
		set_addr(client);
		p = (struct pollfd){ .fd = go[0], .events = POLLIN };
		CHECK(poll(&p, 1, WAIT_MS) == 1 && read(go[0], &c, 1) == 1);
		id = client_connect(server, port, &ch);
		CHECK(write(sent[1], "s", 1) == 1);
		e = expect(ch, RDMA_CM_EVENT_REJECTED);
		CHECK(e->status == 28);
		CHECK(rdma_ack_cm_event(e) == 0);
		client_close(id, ch);
		exit(0);
	}
	set_addr(server);
	{
		struct rdma_event_channel *ch = rdma_create_event_channel();
		struct rdma_cm_id *listen;
		struct sockaddr_in a = sin_of(server, port);
		struct rdma_cm_event *e;
		CHECK(ch);
		CHECK(rdma_create_id(ch, &listen, NULL, RDMA_PS_TCP) == 0);
		CHECK(rdma_bind_addr(listen, (struct sockaddr *)&a) == 0);
		CHECK(write(go[1], "g", 1) == 1);
		p = (struct pollfd){ .fd = sent[0], .events = POLLIN };
		CHECK(poll(&p, 1, WAIT_MS) == 1 && read(sent[0], &c, 1) == 1);
		/* The request is on its way (one hop on this host): let it arrive. */
		usleep(2000);
		CHECK(rdma_listen(listen, 4) == 0);
		p = (struct pollfd){ .fd = ch->fd, .events = POLLIN };
		CHECK(poll(&p, 1, LISTEN_AFTER_REQUEST_BOUND_MS) == 1);
		e = expect(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
		CHECK(e->listen_id == listen);
		{
			struct rdma_cm_id *id = e->id;
			CHECK(rdma_reject(id, NULL, 0) == 0);
			CHECK(rdma_ack_cm_event(e) == 0);
			CHECK(rdma_destroy_id(id) == 0);
		}
		reap(pid);
		CHECK(rdma_destroy_id(listen) == 0);
		rdma_destroy_event_channel(ch);
	}
}

int main(int argc, char **argv)
{
	int server, client, port, r = 0;
	if (argc != 5) {
		fprintf(stderr, "usage: %s SCENARIO SERVER_OCTET CLIENT_OCTET PORT\n", argv[0]);
		return 2;
	}
	scenario = argv[1];
	server = atoi(argv[2]);
	client = atoi(argv[3]);
	port = atoi(argv[4]);
	if (!strcmp(scenario, "reject"))
		r = two_process(server, client, port, serve_reject, client_reject);
	else if (!strcmp(scenario, "no_listener"))
		r = two_process(server, client, port, NULL, client_no_listener);
	else if (!strcmp(scenario, "active_disconnects"))
		r = two_process(server, client, port, serve_connected, client_connected);
	else if (!strcmp(scenario, "passive_disconnects")) {
		passive_disconnects = 1;
		r = two_process(server, client, port, serve_connected, client_connected);
	} else if (!strcmp(scenario, "destroy_waits_for_ack"))
		destroy_waits_for_ack(server);
	else if (!strcmp(scenario, "nonblocking_channel"))
		nonblocking_channel(server);
	else if (!strcmp(scenario, "libfabric_calls"))
		libfabric_calls(server);
	else if (!strcmp(scenario, "listen_after_request"))
		listen_after_request(server, client, port);
	else if (!strcmp(scenario, "bad_arguments"))
		bad_arguments(server);
	else {
		fprintf(stderr, "unknown scenario %s\n", scenario);
		return 2;
	}
	if (r == 0)
		printf("ok %s\n", scenario);
	return r;
}
