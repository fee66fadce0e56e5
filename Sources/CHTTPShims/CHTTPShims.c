#include "CHTTPShims.h"

#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>

struct MHD_Daemon *lattice_mhd_start(const lattice_mhd_config *config,
                                     MHD_AccessHandlerCallback handler, void *handler_context,
                                     MHD_RequestCompletedCallback completed, void *completed_context) {
    if (config == NULL || handler == NULL || config->thread_pool_size == 0) {
        return NULL;
    }
    struct sockaddr_in address;
    memset(&address, 0, sizeof(address));
    address.sin_family = AF_INET;
    address.sin_port = htons(config->port);
    address.sin_addr.s_addr = config->bind_address_be;

    unsigned int flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
#ifdef MHD_USE_EPOLL
    flags |= MHD_USE_EPOLL;
#endif
    return MHD_start_daemon(
        flags, config->port, NULL, NULL, handler, handler_context,
        MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&address,
        MHD_OPTION_THREAD_POOL_SIZE, config->thread_pool_size,
        MHD_OPTION_CONNECTION_TIMEOUT, config->connection_timeout_s,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, config->per_ip_connection_limit,
        MHD_OPTION_CONNECTION_LIMIT, config->connection_limit,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, config->connection_memory_limit,
        MHD_OPTION_NOTIFY_COMPLETED, completed, completed_context,
        MHD_OPTION_END);
}

uint16_t lattice_mhd_bound_port(struct MHD_Daemon *daemon) {
    if (daemon == NULL) {
        return 0;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(daemon, MHD_DAEMON_INFO_BIND_PORT);
    return info == NULL ? 0 : info->port;
}
