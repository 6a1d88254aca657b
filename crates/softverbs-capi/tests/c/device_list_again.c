/*
 * Asks for the device list three times while the device cannot open (the test makes its
 * environment malformed): each call must fail with the same errno (ibv_get_device_list(3):
 * NULL and errno set), and the drop-in says why on stderr once, not once per call.
 * Prints "list N: NULL errno E" for each call, or "list N: M devices".
 */
#include <errno.h>
#include <stdio.h>
#include <infiniband/verbs.h>

int main(void)
{
	for (int n = 1; n <= 3; n++) {
		int num = 0;
		struct ibv_device **list;

		errno = 0;
		list = ibv_get_device_list(&num);
		if (list) {
			printf("list %d: %d devices\n", n, num);
			ibv_free_device_list(list);
		} else {
			printf("list %d: NULL errno %d\n", n, errno);
		}
	}
	return 0;
}
