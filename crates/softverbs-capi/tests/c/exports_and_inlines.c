/*
 * Device, port and GID queries, PDs and CQs on the drop-in, driven the way C programs
 * drive them: through the exported symbols *and* the verbs.h inline functions (ibv_query_port,
 * ibv_query_device_ex, ibv_query_rt_values_ex, ibv_create_cq_ex, ibv_query_gid_ex), which
 * reach the library only through the extended context's memory layout.
 *
 * Prints "ok <n> checks" and exits 0, or prints the failed check and exits 1.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <infiniband/verbs.h>

/* From rdma-core's driver.h, which Debian does not install. */
int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size);

static int checks;

#define CHECK(cond)                                                                   \
	do {                                                                          \
		checks++;                                                             \
		if (!(cond)) {                                                        \
			fprintf(stderr, "%s:%d: check failed: %s (errno %d)\n",       \
				__FILE__, __LINE__, #cond, errno);                    \
			exit(1);                                                      \
		}                                                                     \
	} while (0)

int main(void)
{
	int num = -1;
	struct ibv_device **list = ibv_get_device_list(&num);
	CHECK(list != NULL);
	CHECK(num == 1);
	CHECK(list[0] != NULL && list[1] == NULL);
	struct ibv_device *dev = list[0];
	CHECK(strcmp(ibv_get_device_name(dev), "softverbs0") == 0);
	CHECK(dev->node_type == IBV_NODE_CA);
	CHECK(dev->transport_type == IBV_TRANSPORT_IB);
	CHECK(ibv_get_device_index(dev) == 0);
	CHECK(ibv_get_device_guid(dev) != 0);

	struct ibv_context *ctx = ibv_open_device(dev);
	CHECK(ctx != NULL);
	ibv_free_device_list(list);
	CHECK(ctx->device == dev); /* device pointers outlive the list */
	CHECK(ctx->num_comp_vectors >= 1);
	CHECK(ctx->async_fd >= 0);

	/* ibv_query_device (exported) */
	struct ibv_device_attr attr;
	memset(&attr, 0, sizeof(attr));
	CHECK(ibv_query_device(ctx, &attr) == 0);
	CHECK(attr.vendor_id == 0xffffff && attr.vendor_part_id == 0);
	CHECK(attr.phys_port_cnt == 1);
	CHECK(attr.node_guid == ibv_get_device_guid(dev));
	CHECK(attr.max_qp_rd_atom >= 1);

	/* ibv_query_device_ex (inline -> verbs_context.query_device_ex) */
	struct ibv_device_attr_ex attr_ex;
	memset(&attr_ex, 0xaa, sizeof(attr_ex));
	CHECK(ibv_query_device_ex(ctx, NULL, &attr_ex) == 0);
	CHECK(attr_ex.completion_timestamp_mask != 0);
	CHECK(attr_ex.hca_core_clock == 1000000);
	CHECK(attr_ex.orig_attr.vendor_id == 0xffffff);
	/* On-demand paging, explicit and implicit (odp.c pins the rest). */
	CHECK(attr_ex.odp_caps.general_caps == (IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT));
	CHECK(attr_ex.max_dm_size == 0);
	struct ibv_query_device_ex_input input = { .comp_mask = 1 };
	CHECK(ibv_query_device_ex(ctx, &input, &attr_ex) == EINVAL);

	/* ibv_query_rt_values_ex (inline -> verbs_context.query_rt_values) */
	struct ibv_values_ex v1 = { .comp_mask = IBV_VALUES_MASK_RAW_CLOCK };
	struct ibv_values_ex v2 = { .comp_mask = IBV_VALUES_MASK_RAW_CLOCK };
	CHECK(ibv_query_rt_values_ex(ctx, &v1) == 0);
	CHECK(ibv_query_rt_values_ex(ctx, &v2) == 0);
	CHECK(v1.comp_mask == IBV_VALUES_MASK_RAW_CLOCK);
	CHECK(v2.raw_clock.tv_nsec >= v1.raw_clock.tv_nsec);

	/* ibv_query_port (the inline macro -> verbs_context.query_port, 52 bytes) */
	struct ibv_port_attr port;
	memset(&port, 0xaa, sizeof(port));
	CHECK(ibv_query_port(ctx, 1, &port) == 0);
	CHECK(port.state == IBV_PORT_ACTIVE);
	CHECK(port.link_layer == IBV_LINK_LAYER_ETHERNET);
	CHECK(port.active_mtu >= IBV_MTU_1024 && port.active_mtu <= port.max_mtu);
	CHECK(port.gid_tbl_len >= 1 && port.pkey_tbl_len >= 1);
	CHECK(port.max_msg_sz >= (1u << 31));
	CHECK(port.port_cap_flags2 == 0); /* written (zero), not left 0xaaaa */
	CHECK(ibv_query_port(ctx, 2, &port) == EINVAL);

	/* GIDs, laid out as kernel rxe's: 0 link-local (fe80::), 1 IPv4-mapped (::ffff:) */
	union ibv_gid gid;
	CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0);
	CHECK(gid.raw[0] == 0xfe && gid.raw[1] == 0x80); /* link-local */
	CHECK(ibv_query_gid(ctx, 1, 1, &gid) == 0);
	CHECK(gid.raw[0] == 0 && gid.raw[10] == 0xff && gid.raw[11] == 0xff); /* IPv4-mapped */
	CHECK(ibv_query_gid(ctx, 1, port.gid_tbl_len, &gid) == -1);
	struct ibv_gid_entry entry;
	CHECK(ibv_query_gid_ex(ctx, 1, 1, &entry, 0) == 0);
	CHECK(entry.gid_type == IBV_GID_TYPE_ROCE_V2);
	CHECK(memcmp(&entry.gid, &gid, sizeof(gid)) == 0);
	struct ibv_gid_entry table[4];
	CHECK(ibv_query_gid_table(ctx, table, 4, 0) == port.gid_tbl_len);
	__be16 pkey = 0;
	CHECK(ibv_query_pkey(ctx, 1, 0, &pkey) == 0);
	CHECK(pkey == htobe16(0xffff));
	CHECK(ibv_get_pkey_index(ctx, 1, pkey) == 0);

	/* PD */
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd != NULL && pd->context == ctx);
	CHECK(ibv_dealloc_pd(pd) == 0);

	/* Completion channel: a pollable fd that honours O_NONBLOCK */
	struct ibv_comp_channel *channel = ibv_create_comp_channel(ctx);
	CHECK(channel != NULL && channel->context == ctx && channel->fd >= 0);
	struct pollfd pfd = { .fd = channel->fd, .events = POLLIN };
	CHECK(poll(&pfd, 1, 0) == 0);
	CHECK(fcntl(channel->fd, F_SETFL, fcntl(channel->fd, F_GETFL) | O_NONBLOCK) == 0);
	CHECK(ibv_destroy_comp_channel(channel) == 0);

	/* CQs through the export and through the extended context; bad sizes are EINVAL
	 * (ibv_create_cq(3): "cqe ... at least 1 and at most max_cqe") */
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, (void *)ctx, NULL, 0);
	CHECK(cq != NULL && cq->context == ctx && cq->cqe >= 16 && cq->cq_context == (void *)ctx);
	struct ibv_wc wc;
	CHECK(ibv_poll_cq(cq, 1, &wc) == 0);
	CHECK(ibv_req_notify_cq(cq, 0) == 0);
	CHECK(ibv_destroy_cq(cq) == 0);
	errno = 0;
	CHECK(ibv_create_cq(ctx, 0, NULL, NULL, 0) == NULL && errno == EINVAL);
	errno = 0;
	CHECK(ibv_create_cq(ctx, 16, NULL, NULL, 7) == NULL && errno == EINVAL);
	struct ibv_cq_init_attr_ex cq_attr = { .cqe = 16, .wc_flags = IBV_WC_EX_WITH_COMPLETION_TIMESTAMP };
	struct ibv_cq_ex *cq_ex = ibv_create_cq_ex(ctx, &cq_attr);
	CHECK(cq_ex != NULL);
	struct ibv_poll_cq_attr poll_attr = { 0 };
	CHECK(ibv_start_poll(cq_ex, &poll_attr) == ENOENT);
	CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(cq_ex)) == 0);
	cq_attr.wc_flags = 1ULL << 40;
	errno = 0;
	CHECK(ibv_create_cq_ex(ctx, &cq_attr) == NULL && errno == EOPNOTSUPP);

	/* Not offered by the soft device: documented failures, never a crash */
	errno = 0;
	CHECK(ibv_reg_mr(NULL, NULL, 0, IBV_ACCESS_LOCAL_WRITE) == NULL && errno == EINVAL);
	struct ibv_pd *pd2 = ibv_alloc_pd(ctx);
	/* ibv_alloc_pd(3): "ibv_dealloc_pd() may fail if any other resource is still associated
	 * with the PD being freed" (EBUSY, as the kernel answers) */
	static char region[4096];
	struct ibv_mr *mr = ibv_reg_mr(pd2, region, sizeof(region), IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr != NULL && mr->pd == pd2 && mr->lkey != 0 && mr->length == sizeof(region));
	CHECK(ibv_dealloc_pd(pd2) == EBUSY);
	errno = 0;
	CHECK(ibv_reg_mr(pd2, region, sizeof(region), IBV_ACCESS_REMOTE_WRITE) == NULL && errno == EINVAL);
	CHECK(ibv_dereg_mr(mr) == 0);
	/* ibv_alloc_mw(3): a window of either type; a type that is neither is EINVAL; the
	 * PD is busy while the window is in it (ibv_alloc_pd(3)) */
	struct ibv_mw *mw = ibv_alloc_mw(pd2, IBV_MW_TYPE_1);
	CHECK(mw != NULL && mw->pd == pd2 && mw->type == IBV_MW_TYPE_1 && mw->rkey != 0);
	errno = 0;
	CHECK(ibv_alloc_mw(pd2, (enum ibv_mw_type)3) == NULL && errno == EINVAL);
	CHECK(ibv_dealloc_pd(pd2) == EBUSY);
	CHECK(ibv_dealloc_mw(mw) == 0);
	errno = 0;
	CHECK(ibv_reg_dmabuf_mr(pd2, 0, 4096, 0, -1, IBV_ACCESS_LOCAL_WRITE) == NULL && errno == EOPNOTSUPP);
	CHECK(ibv_dealloc_pd(pd2) == 0);
	CHECK(ibv_read_sysfs_file(dev->ibdev_path, "board_id", (char[64]){ 0 }, 64) == -1);

	/* NULL arguments: the documented errno */
	CHECK(ibv_query_device(NULL, &attr) == EINVAL);
	errno = 0;
	CHECK(ibv_alloc_pd(NULL) == NULL && errno == EINVAL);
	CHECK(ibv_dealloc_pd(NULL) == EINVAL);
	CHECK(ibv_query_gid(ctx, 1, 0, NULL) == -1 && errno == EINVAL);

	/* strings and fork */
	CHECK(strcmp(ibv_wc_status_str(IBV_WC_WR_FLUSH_ERR), "Work Request Flushed Error") == 0);
	CHECK(strcmp(ibv_node_type_str(IBV_NODE_CA), "InfiniBand channel adapter") == 0);
	CHECK(strcmp(ibv_port_state_str(IBV_PORT_ACTIVE), "active") == 0);
	CHECK(strcmp(ibv_event_type_str(IBV_EVENT_PORT_ACTIVE), "port active") == 0);
	CHECK(ibv_fork_init() == 0);
	CHECK(ibv_is_fork_initialized() == IBV_FORK_UNNEEDED);

	CHECK(ibv_close_device(ctx) == 0);
	printf("ok %d checks\n", checks);
	return 0;
}
