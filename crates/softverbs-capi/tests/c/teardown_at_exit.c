/*
 * Tearing down from an atexit handler, as many C programs do: the QP, the CQ and the PD
 * are destroyed and the device closed after main returned. By then the C library has
 * destroyed the main thread's thread-locals (exit(3) runs the thread-local destructors
 * before the atexit handlers), which a logging library must not touch. With
 * SOFTVERBS_LOG=debug each call must still return 0 (ibv_destroy_qp(3), ibv_destroy_cq(3),
 * ibv_dealloc_pd(3), ibv_close_device(3)).
 *
 * main brings an RC QP to INIT (so that the library has logged on this thread) and
 * registers the handler after its first verbs call, so the handler runs before the
 * library's own exit hook (atexit handlers run in reverse order). The handler prints
 * "teardown: destroy_qp R destroy_cq R dealloc_pd R close_device R" with each return
 * value.
 */
#include <stdio.h>
#include <stdlib.h>
#include <infiniband/verbs.h>

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static struct ibv_qp *qp;

static void teardown(void)
{
	int q = ibv_destroy_qp(qp);
	int c = ibv_destroy_cq(cq);
	int p = ibv_dealloc_pd(pd);
	int d = ibv_close_device(ctx);

	printf("teardown: destroy_qp %d destroy_cq %d dealloc_pd %d close_device %d\n", q, c, p, d);
	fflush(stdout);
}

int main(void)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);

	if (!list || n < 1) {
		fprintf(stderr, "FAIL no device\n");
		return 1;
	}
	ctx = ibv_open_device(list[0]);
	ibv_free_device_list(list);
	if (!ctx) {
		fprintf(stderr, "FAIL ibv_open_device\n");
		return 1;
	}
	pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	if (!pd || !cq) {
		fprintf(stderr, "FAIL ibv_alloc_pd / ibv_create_cq\n");
		return 1;
	}
	struct ibv_qp_init_attr init = {
		.send_cq = cq,
		.recv_cq = cq,
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	qp = ibv_create_qp(pd, &init);
	if (!qp) {
		fprintf(stderr, "FAIL ibv_create_qp\n");
		return 1;
	}
	struct ibv_qp_attr attr = { .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1 };
	if (ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) {
		fprintf(stderr, "FAIL ibv_modify_qp to INIT\n");
		return 1;
	}
	if (atexit(teardown)) {
		fprintf(stderr, "FAIL atexit\n");
		return 1;
	}
	return 0;
}
