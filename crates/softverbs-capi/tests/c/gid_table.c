/*
 * What programs written for kernel rxe assume about a port, on the drop-in (issue #17):
 *
 *   1 the GID table is laid out as rxe lays out the table of an interface holding the
 *     device's IPv4 address (RoCEv2 entries): index 0 the IPv6 link-local GID
 *     (fe80::/64; softverbs makes it from the address: fe80::ffff:a.b.c.d), index 1 the
 *     IPv4-mapped GID ::ffff:a.b.c.d of SOFTVERBS_ADDR; ibv_query_port's gid_tbl_len
 *     counts exactly those, and index gid_tbl_len fails with EINVAL (ibv_query_gid(3))
 *   2 ibv_query_gid_ex(3), ibv_query_gid_table(3) and ibv_query_gid_type agree with
 *     ibv_query_gid on every entry: same GID, gid_index, port 1, RoCE v2
 *   3 every entry's ndev_ifindex is the interface holding the address ("The netdev
 *     ifindex"), here lo for 127.0.0.0/8: if_indextoname(3) names it
 *   4 ibv_get_device_name(3) reads the struct ibv_device it is given, as rdma-core's
 *     (`return device->name`): a struct the program built itself gives its own name
 *   5 an RC QP pair of the device connected through GID index 0 on one side and 1 on the
 *     other (sgid_index and the peer's dgid) carries a SEND each way: both entries reach
 *     the device
 *
 * Run with SOFTVERBS_ADDR=127.0.0.N:PORT. Prints one "rule N ...: ok" line per rule and
 * "ok <checks> checks" at the end.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <net/if.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#include "rules.h"

/* Provider-private (libibverbs' driver.h, not installed); ibv_devinfo imports it. */
int ibv_query_gid_type(struct ibv_context *context, uint8_t port_num, unsigned int index,
		       uint32_t *type);
/* enum ibv_gid_type_sysfs */
#define GID_TYPE_SYSFS_ROCE_V2 1

static void rule_ok(const char *what)
{
	alarm(0);
	printf("rule %s: %s: ok\n", rule, what);
	fflush(stdout);
}

static const char *gid_text(const union ibv_gid *gid, char *buf)
{
	return inet_ntop(AF_INET6, gid->raw, buf, INET6_ADDRSTRLEN);
}

static void connect_through(struct ibv_qp *qp, uint32_t remote, const union ibv_gid *dgid,
			    uint8_t sgid_index)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT,
		.pkey_index = 0,
		.port_num = 1,
	};
	CHECK(ibv_modify_qp(qp, &a,
			    IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = remote;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = *dgid;
	a.ah_attr.grh.sgid_index = sgid_index;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = 1;
	CHECKF(ibv_modify_qp(qp, &a,
			     IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				     IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
				     IBV_QP_MIN_RNR_TIMER) == 0,
	       "RTR with sgid_index %u", sgid_index);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	CHECK(ibv_modify_qp(qp, &a,
			    IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				    IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) == 0);
}

int main(void)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	signal(SIGALRM, watchdog);
	char text[INET6_ADDRSTRLEN], other[INET6_ADDRSTRLEN];

	start_rule("setup");
	const char *env = getenv("SOFTVERBS_ADDR");
	CHECKF(env != NULL, "SOFTVERBS_ADDR is not set");
	char address[64];
	snprintf(address, sizeof(address), "%s", env);
	char *colon = strchr(address, ':');
	if (colon)
		*colon = 0;
	struct in_addr v4;
	CHECKF(inet_pton(AF_INET, address, &v4) == 1, "SOFTVERBS_ADDR %s is not IPv4", env);
	struct ibv_context *context = open_softverbs0();
	struct ibv_port_attr port;
	CHECK(ibv_query_port(context, 1, &port) == 0);
	rule_ok("the device of SOFTVERBS_ADDR and its port");

	start_rule("1");
	union ibv_gid expected[2];
	memset(expected, 0, sizeof(expected));
	expected[0].raw[0] = 0xfe;
	expected[0].raw[1] = 0x80;
	expected[0].raw[10] = 0xff;
	expected[0].raw[11] = 0xff;
	memcpy(&expected[0].raw[12], &v4, 4);
	expected[1].raw[10] = 0xff;
	expected[1].raw[11] = 0xff;
	memcpy(&expected[1].raw[12], &v4, 4);
	CHECKF(port.gid_tbl_len == 2, "gid_tbl_len %d, expected 2", port.gid_tbl_len);
	union ibv_gid gids[2];
	for (int i = 0; i < 2; i++) {
		CHECKF(ibv_query_gid(context, 1, i, &gids[i]) == 0, "ibv_query_gid index %d", i);
		CHECKF(memcmp(&gids[i], &expected[i], sizeof(gids[i])) == 0,
		       "GID[%d] is %s, expected %s", i, gid_text(&gids[i], text),
		       gid_text(&expected[i], other));
	}
	union ibv_gid beyond;
	errno = 0;
	CHECK(ibv_query_gid(context, 1, port.gid_tbl_len, &beyond) != 0);
	CHECKF(errno == EINVAL, "index gid_tbl_len: errno %d, expected EINVAL", errno);
	rule_ok("GID 0 the link-local fe80::ffff:a.b.c.d, GID 1 ::ffff:a.b.c.d, gid_tbl_len 2");

	start_rule("2");
	struct ibv_gid_entry entries[4];
	memset(entries, 0xaa, sizeof(entries));
	ssize_t n = ibv_query_gid_table(context, entries, 4, 0);
	CHECKF(n == 2, "ibv_query_gid_table gave %zd entries, expected 2", n);
	for (int i = 0; i < 2; i++) {
		struct ibv_gid_entry one;
		CHECKF(ibv_query_gid_ex(context, 1, i, &one, 0) == 0, "ibv_query_gid_ex %d", i);
		CHECK(memcmp(&one.gid, &gids[i], sizeof(one.gid)) == 0);
		CHECK(one.gid_index == (uint32_t)i && one.port_num == 1);
		CHECK(one.gid_type == IBV_GID_TYPE_ROCE_V2);
		CHECK(memcmp(&entries[i], &one, sizeof(one)) == 0);
		uint32_t type = 99;
		CHECK(ibv_query_gid_type(context, 1, i, &type) == 0);
		CHECKF(type == GID_TYPE_SYSFS_ROCE_V2, "GID %d type %u", i, type);
	}
	struct ibv_gid_entry none;
	CHECK(ibv_query_gid_ex(context, 1, port.gid_tbl_len, &none, 0) == EINVAL);
	rule_ok("ibv_query_gid_ex, ibv_query_gid_table and ibv_query_gid_type agree");

	start_rule("3");
	unsigned int lo = if_nametoindex("lo");
	CHECK(lo != 0);
	for (int i = 0; i < 2; i++) {
		char name[IF_NAMESIZE];
		CHECKF(entries[i].ndev_ifindex == lo, "GID %d: ndev_ifindex %u, expected lo's %u", i,
		       entries[i].ndev_ifindex, lo);
		CHECK(if_indextoname(entries[i].ndev_ifindex, name) != NULL);
		CHECK(strcmp(name, "lo") == 0);
	}
	rule_ok("every GID's ndev_ifindex is lo's, and if_indextoname names it");

	start_rule("4");
	struct ibv_device own;
	memset(&own, 0, sizeof(own));
	snprintf(own.name, sizeof(own.name), "%s", "mine0");
	const char *name = ibv_get_device_name(&own);
	CHECKF(name == own.name, "ibv_get_device_name of a struct of the program: %p, expected %p",
	       (const void *)name, (void *)own.name);
	struct ibv_device **list = ibv_get_device_list(NULL);
	CHECK(list != NULL && list[0] != NULL);
	CHECK(ibv_get_device_name(list[0]) == list[0]->name);
	CHECK(strcmp(ibv_get_device_name(list[0]), "softverbs0") == 0);
	ibv_free_device_list(list);
	rule_ok("ibv_get_device_name returns the name of the struct it is given");

	start_rule("5");
	struct ibv_pd *pd = ibv_alloc_pd(context);
	CHECK(pd != NULL);
	struct ibv_cq *cq = ibv_create_cq(context, 8, NULL, NULL, 0);
	CHECK(cq != NULL);
	struct ibv_qp_init_attr init = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = { .max_send_wr = 2, .max_recv_wr = 2, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	struct ibv_qp *a = ibv_create_qp(pd, &init);
	struct ibv_qp *b = ibv_create_qp(pd, &init);
	CHECK(a != NULL && b != NULL);
	char buf[2][64];
	memset(buf, 0, sizeof(buf));
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr != NULL);
	/* a sends from GID 0 to b's GID 1; b sends from GID 1 to a's GID 0 */
	connect_through(a, b->qp_num, &gids[1], 0);
	connect_through(b, a->qp_num, &gids[0], 1);
	struct ibv_qp *qps[2] = { a, b };
	for (int i = 0; i < 2; i++) {
		struct ibv_sge sge = { .addr = (uintptr_t)buf[i], .length = 32, .lkey = mr->lkey };
		struct ibv_recv_wr rwr = { .wr_id = 10 + i, .sg_list = &sge, .num_sge = 1 }, *bad_r;
		CHECK(ibv_post_recv(qps[i], &rwr, &bad_r) == 0);
	}
	for (int i = 0; i < 2; i++) {
		char *out = buf[i] + 32;
		snprintf(out, 32, "from qp %d", i);
		struct ibv_sge sge = { .addr = (uintptr_t)out, .length = 32, .lkey = mr->lkey };
		struct ibv_send_wr swr = { .wr_id = 20 + i, .sg_list = &sge, .num_sge = 1,
					   .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED },
				   *bad_s;
		CHECK(ibv_post_send(qps[i], &swr, &bad_s) == 0);
	}
	struct ibv_wc wc[4];
	int got = poll_until(cq, 4, wc, WAIT_MS);
	CHECKF(got == 4, "%d of 4 completions", got);
	for (int i = 0; i < 4; i++)
		CHECKF(wc[i].status == IBV_WC_SUCCESS, "wr %llu: %s", (unsigned long long)wc[i].wr_id,
		       ibv_wc_status_str(wc[i].status));
	CHECK(strcmp(buf[0], "from qp 1") == 0 && strcmp(buf[1], "from qp 0") == 0);
	rule_ok("QPs connected through GID 0 and GID 1 carry a SEND each way");

	start_rule("teardown");
	CHECK(ibv_destroy_qp(a) == 0 && ibv_destroy_qp(b) == 0);
	CHECK(ibv_dereg_mr(mr) == 0);
	CHECK(ibv_destroy_cq(cq) == 0);
	CHECK(ibv_dealloc_pd(pd) == 0);
	CHECK(ibv_close_device(context) == 0);
	rule_ok("everything destroyed");
	printf("ok %d checks\n", checks);
	return 0;
}
