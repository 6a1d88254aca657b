/*
 * Import on the drop-in: a context's cmd_fd is a real descriptor that names the device,
 * so ibv_import_device(3), ibv_import_pd(3) and ibv_import_mr(3) (with ibv_unimport_pd
 * and ibv_unimport_mr) give new structs for the same device, PD and registration.
 *
 * One process, one device (softverbs0). The original context `ctx` allocates the PD and
 * registers `src`; the imported context `ctx2` (from dup(ctx->cmd_fd)) imports both,
 * registers `dst` through the imported PD, and connects two RC QPs of its own.
 *
 *   1 ibv_import_device(3): ctx->cmd_fd is an open descriptor (close-on-exec); a dup of
 *     it imports a new context, its own struct (cmd_fd the dup) on the same device
 *   2 ibv_import_pd(3): a new struct for pd->handle, in ctx2; a region registered through
 *     it is in the same PD (ibv_dealloc_pd(3) of the original struct is EBUSY)
 *   3 ibv_import_mr(3): a new struct for mr->handle in the imported PD, with the
 *     registration's addr, length, lkey, rkey and handle
 *   4 the imported objects work: an RDMA WRITE between ctx2's two QPs whose local SGE
 *     uses the imported MR's lkey lands in the region registered through the imported PD
 *   5 ibv_unimport_mr / ibv_unimport_pd free the structs only: the registration and the
 *     PD stay (the original lkey still works, both import again)
 *   6 unknown handles: ibv_import_pd and ibv_import_mr are NULL with ENOENT (the kernel's
 *     answer to an unknown object handle); an MR imported into a PD it is not in is EINVAL
 *   7 descriptors that are not a device's: -1, a closed descriptor and a pipe are NULL
 *     with EINVAL (rdma-core: fstat fails or the file is not a character device);
 *     /dev/null, a character device that is no device of this process, is ENODEV
 *   8 another process: the descriptor passed with SCM_RIGHTS to a new process (fork +
 *     exec, which opens its own softverbs0 first), and to a child of fork alone (a copy
 *     of this process's memory without the device's threads), is NULL with ENODEV there:
 *     the device's state lives in this process
 *   9 closing the original context leaves the imported one working: another WRITE
 *     through ctx2's QPs, and ctx2's descriptor imports a third context
 *
 * Prints one "rule N: ...: ok" line per rule and "ok <checks> checks" at the end; exits 1
 * with "FAIL rule N" on stderr at the first failed check. Every wait is bounded.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#include "rules.h"

static void rule_ok(const char *what)
{
	alarm(0);
	printf("rule %s: %s: ok\n", rule, what);
	fflush(stdout);
}

#define REGION 4096
#define REMOTE_RW (IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE)

/* ------------------------------------------------------------------ the other process */

/* Receives one descriptor over `sock` (SCM_RIGHTS); -1 if none came. */
static int receive_fd(int sock)
{
	char byte;
	struct iovec iov = { .iov_base = &byte, .iov_len = 1 };
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} control;
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
			      .msg_controllen = sizeof(control.buf) };
	if (recvmsg(sock, &msg, 0) != 1)
		return -1;
	struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
	if (!c || c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
		return -1;
	int fd;
	memcpy(&fd, CMSG_DATA(c), sizeof(fd));
	return fd;
}

static void send_fd(int sock, int fd)
{
	char byte = 'F';
	struct iovec iov = { .iov_base = &byte, .iov_len = 1 };
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} control;
	memset(&control, 0, sizeof(control));
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
			      .msg_controllen = sizeof(control.buf) };
	struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &fd, sizeof(fd));
	CHECKF(sendmsg(sock, &msg, 0) == 1, "sendmsg(SCM_RIGHTS)");
}

/*
 * The receiving process (`import --receive <socket fd>`): opens its own softverbs0, then
 * imports the descriptor it receives. Exit 0 when the import is refused with ENODEV, 10 +
 * what went wrong otherwise (said on stderr).
 */
static int receiver(int sock)
{
	struct ibv_context *own = open_softverbs0();
	int fd = receive_fd(sock);
	if (fd < 0) {
		fprintf(stderr, "receiver: no descriptor came\n");
		return 10;
	}
	errno = 0;
	struct ibv_context *imported = ibv_import_device(fd);
	int err = errno;
	if (imported) {
		fprintf(stderr, "receiver: ibv_import_device of another process's cmd_fd "
				"succeeded\n");
		ibv_close_device(imported);
		return 11;
	}
	if (err != ENODEV) {
		fprintf(stderr, "receiver: errno %d (%s), expected ENODEV\n", err, strerror(err));
		return 12;
	}
	/* The refused descriptor stays the caller's. */
	if (fcntl(fd, F_GETFD) < 0) {
		fprintf(stderr, "receiver: the refused descriptor was closed\n");
		return 13;
	}
	close(fd);
	close(sock);
	return ibv_close_device(own) == 0 ? 0 : 14;
}

/* ------------------------------------------------------------------ QPs of ctx2 */

struct pair {
	struct ibv_cq *cq;
	struct ibv_qp *a, *b;
};

static struct pair make_pair(struct ibv_context *c, struct ibv_pd *p, const union ibv_gid *gid)
{
	struct pair r;
	r.cq = ibv_create_cq(c, 16, NULL, NULL, 0);
	CHECK(r.cq != NULL);
	struct ibv_qp_init_attr attr = {
		.send_cq = r.cq,
		.recv_cq = r.cq,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
		.sq_sig_all = 1,
	};
	r.a = ibv_create_qp(p, &attr);
	r.b = ibv_create_qp(p, &attr);
	CHECKF(r.a != NULL && r.b != NULL, "ibv_create_qp(RC) through the imported PD");
	connect_rc(r.a, r.b->qp_num, gid, REMOTE_RW);
	connect_rc(r.b, r.a->qp_num, gid, REMOTE_RW);
	return r;
}

/* An RDMA WRITE of `len` bytes from `local` (lkey) to `remote` (rkey), completed. */
static void write_through(struct pair *p, uint64_t wr_id, void *local, uint32_t lkey,
			  void *remote, uint32_t rkey, uint32_t len)
{
	struct ibv_sge sge = { .addr = (uintptr_t)local, .length = len, .lkey = lkey };
	struct ibv_send_wr wr = {
		.wr_id = wr_id,
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = (uintptr_t)remote, .rkey = rkey },
	};
	struct ibv_send_wr *bad = NULL;
	CHECKF(ibv_post_send(p->a, &wr, &bad) == 0, "ibv_post_send(RDMA_WRITE)");
	struct ibv_wc wc;
	int got = poll_until(p->cq, 1, &wc, WAIT_MS);
	CHECKF(got == 1, "no completion of the WRITE (%d)", got);
	CHECKF(wc.status == IBV_WC_SUCCESS && wc.wr_id == wr_id, "WRITE completed %s",
	       ibv_wc_status_str(wc.status));
}

/* ------------------------------------------------------------------ main */

int main(int argc, char **argv)
{
	if (argc == 3 && strcmp(argv[1], "--receive") == 0)
		return receiver(atoi(argv[2]));

	signal(SIGALRM, watchdog);
	setvbuf(stdout, NULL, _IOLBF, 0);
	start_rule("setup");
	struct ibv_context *ctx = open_softverbs0();
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd != NULL);
	union ibv_gid gid;
	CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0);
	char *src = aligned_alloc(4096, REGION), *dst = aligned_alloc(4096, REGION);
	CHECK(src != NULL && dst != NULL);
	for (int i = 0; i < REGION; i++)
		src[i] = (char)(i * 7 + 1);
	memset(dst, 0, REGION);
	struct ibv_mr *mr = ibv_reg_mr(pd, src, REGION, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr != NULL);
	rule_ok("an original context, a PD and a region");

	start_rule("1");
	struct stat st;
	CHECKF(ctx->cmd_fd >= 0 && fstat(ctx->cmd_fd, &st) == 0, "cmd_fd %d is not open",
	       ctx->cmd_fd);
	CHECK(fcntl(ctx->cmd_fd, F_GETFD) & FD_CLOEXEC);
	int fd2 = dup(ctx->cmd_fd);
	CHECK(fd2 >= 0);
	struct ibv_context *ctx2 = ibv_import_device(fd2);
	CHECKF(ctx2 != NULL, "ibv_import_device(dup(cmd_fd))");
	CHECK(ctx2 != ctx && ctx2->cmd_fd == fd2 && ctx2->device == ctx->device);
	struct ibv_device_attr attr;
	CHECK(ibv_query_device(ctx2, &attr) == 0);
	rule_ok("ibv_import_device(3): a dup of cmd_fd imports a context of the same device");

	start_rule("2");
	struct ibv_pd *pd2 = ibv_import_pd(ctx2, pd->handle);
	CHECKF(pd2 != NULL, "ibv_import_pd(ctx2, %u)", pd->handle);
	CHECK(pd2 != pd && pd2->handle == pd->handle && pd2->context == ctx2);
	struct ibv_mr *dst_mr =
		ibv_reg_mr(pd2, dst, REGION, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	CHECKF(dst_mr != NULL, "ibv_reg_mr through the imported PD");
	errno = 0;
	CHECKF(ibv_dealloc_pd(pd) == EBUSY, "ibv_dealloc_pd of the original struct while a "
					    "region registered through the import is in the PD");
	rule_ok("ibv_import_pd(3): the same PD through a new struct");

	start_rule("3");
	struct ibv_mr *imr = ibv_import_mr(pd2, mr->handle);
	CHECKF(imr != NULL, "ibv_import_mr(pd2, %u)", mr->handle);
	CHECK(imr != mr && imr->pd == pd2 && imr->context == ctx2);
	CHECK(imr->handle == mr->handle && imr->lkey == mr->lkey && imr->rkey == mr->rkey);
	CHECK(imr->addr == (void *)src && imr->length == REGION);
	rule_ok("ibv_import_mr(3): the registration's addr, length, keys and handle");

	start_rule("4");
	struct pair p = make_pair(ctx2, pd2, &gid);
	write_through(&p, 1, src, imr->lkey, dst, dst_mr->rkey, 1024);
	CHECK(memcmp(dst, src, 1024) == 0);
	rule_ok("an RDMA WRITE from the imported MR's lkey into a region of the imported PD");

	start_rule("5");
	ibv_unimport_mr(imr);
	write_through(&p, 2, src + 1024, mr->lkey, dst + 1024, dst_mr->rkey, 1024);
	CHECK(memcmp(dst, src, 2048) == 0);
	ibv_unimport_pd(pd2);
	struct ibv_pd *pd3 = ibv_import_pd(ctx2, pd->handle);
	CHECKF(pd3 != NULL, "ibv_import_pd after ibv_unimport_pd");
	struct ibv_mr *imr2 = ibv_import_mr(pd3, mr->handle);
	CHECKF(imr2 != NULL, "ibv_import_mr after ibv_unimport_mr");
	rule_ok("unimport frees the structs only: the PD and the registration stay");

	start_rule("6");
	errno = 0;
	CHECKF(ibv_import_pd(ctx2, 0x7fff0001) == NULL && errno == ENOENT,
	       "ibv_import_pd of an unknown handle");
	errno = 0;
	CHECKF(ibv_import_mr(pd3, 0x7fff0001) == NULL && errno == ENOENT,
	       "ibv_import_mr of an unknown handle");
	struct ibv_pd *other = ibv_alloc_pd(ctx2);
	CHECK(other != NULL);
	errno = 0;
	CHECKF(ibv_import_mr(other, mr->handle) == NULL && errno == EINVAL,
	       "ibv_import_mr into a PD the region is not in");
	CHECK(ibv_dealloc_pd(other) == 0);
	rule_ok("unknown handles: ENOENT; an MR into another PD: EINVAL");

	start_rule("7");
	errno = 0;
	CHECKF(ibv_import_device(-1) == NULL && errno == EINVAL, "ibv_import_device(-1)");
	int closed = dup(ctx->cmd_fd);
	CHECK(closed >= 0 && close(closed) == 0);
	errno = 0;
	CHECKF(ibv_import_device(closed) == NULL && errno == EINVAL,
	       "ibv_import_device of a closed descriptor");
	int pipes[2];
	CHECK(pipe2(pipes, O_CLOEXEC) == 0);
	errno = 0;
	CHECKF(ibv_import_device(pipes[0]) == NULL && errno == EINVAL,
	       "ibv_import_device of a pipe");
	CHECKF(fcntl(pipes[0], F_GETFD) >= 0, "a refused descriptor stays the caller's");
	close(pipes[0]);
	close(pipes[1]);
	int null = open("/dev/null", O_RDWR | O_CLOEXEC);
	CHECK(null >= 0);
	errno = 0;
	CHECKF(ibv_import_device(null) == NULL && errno == ENODEV,
	       "ibv_import_device of /dev/null");
	close(null);
	rule_ok("not a device's descriptor: EINVAL; another character device: ENODEV");

	start_rule("8");
	int sv[2];
	CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
	CHECK(fcntl(sv[0], F_SETFD, FD_CLOEXEC) == 0);
	fflush(stdout);
	fflush(stderr);
	pid_t child = fork();
	CHECK(child >= 0);
	if (child == 0) {
		char num[16];
		snprintf(num, sizeof(num), "%d", sv[1]);
		char *args[] = { argv[0], "--receive", num, NULL };
		execv(argv[0], args);
		_exit(127);
	}
	close(sv[1]);
	send_fd(sv[0], ctx->cmd_fd);
	close(sv[0]);
	int status = 0;
	CHECK(waitpid(child, &status, 0) == child);
	CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0,
	       "the receiving process exited with status %d (see its stderr)", status);
	/* The same to a child of fork alone: it has a copy of this process's memory (the
	 * library's table of descriptors included) but not the device's threads, and the
	 * import is refused there too (an allocation-free path, safe after fork). */
	int sv2[2];
	CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv2) == 0);
	fflush(stdout);
	fflush(stderr);
	pid_t forked = fork();
	CHECK(forked >= 0);
	if (forked == 0) {
		close(sv2[0]);
		int fd = receive_fd(sv2[1]);
		errno = 0;
		struct ibv_context *c = fd < 0 ? NULL : ibv_import_device(fd);
		int err = errno;
		char verdict = fd < 0 ? 'n' : c ? 'i' : err == ENODEV ? 'E' : 'e';
		/* The answer goes back over the socket and the child ends by exec'ing
		 * /bin/true: no exit-time work (atexit handlers, valgrind's leak check, which
		 * counts what only the parent's threads referenced as lost) runs in this copy
		 * of the parent. */
		if (write(sv2[1], &verdict, 1) != 1)
			_exit(13);
		execl("/bin/true", "true", (char *)NULL);
		_exit(14);
	}
	close(sv2[1]);
	send_fd(sv2[0], ctx->cmd_fd);
	char verdict = 0;
	CHECKF(read(sv2[0], &verdict, 1) == 1, "no answer from the forked child");
	close(sv2[0]);
	CHECK(waitpid(forked, &status, 0) == forked);
	CHECKF(verdict == 'E', "the forked child's import: '%c' ('E' is ENODEV, 'i' imported, "
			       "'e' another errno, 'n' no descriptor came)", verdict);
	CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the forked child: status %d",
	       status);
	rule_ok("a descriptor passed with SCM_RIGHTS to another process: ENODEV there");

	start_rule("9");
	/* The original structs are given up before their context closes (the PD and the
	 * region stay: ctx2's imports name them). */
	ibv_unimport_mr(mr);
	ibv_unimport_pd(pd);
	CHECK(ibv_close_device(ctx) == 0);
	write_through(&p, 3, src + 2048, imr2->lkey, dst + 2048, dst_mr->rkey, 2048);
	CHECK(memcmp(dst, src, REGION) == 0);
	CHECK(ibv_query_device(ctx2, &attr) == 0);
	struct ibv_context *ctx3 = ibv_import_device(dup(ctx2->cmd_fd));
	CHECKF(ctx3 != NULL, "ibv_import_device(dup(ctx2->cmd_fd)) after the original closed");
	CHECK(ibv_close_device(ctx3) == 0);
	rule_ok("closing the original context leaves the imported one working");

	start_rule("teardown");
	CHECK(ibv_destroy_qp(p.a) == 0);
	CHECK(ibv_destroy_qp(p.b) == 0);
	CHECK(ibv_destroy_cq(p.cq) == 0);
	CHECK(ibv_dereg_mr(dst_mr) == 0);
	CHECK(ibv_dereg_mr(imr2) == 0);
	CHECK(ibv_dealloc_pd(pd3) == 0);
	CHECK(ibv_close_device(ctx2) == 0);
	free(src);
	free(dst);
	rule_ok("everything through the imported structs");
	printf("ok %d checks\n", checks);
	return 0;
}
