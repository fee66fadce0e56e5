#include "CHTTPShims.h"

#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>

struct MHD_Daemon *lattice_mhd_start(const lattice_mhd_config *config,
                                     MHD_AccessHandlerCallback handler, void *handler_context,
                                     MHD_RequestCompletedCallback completed, void *completed_context,
                                     lattice_mhd_uri_logger uri_logger, void *uri_logger_context) {
    return lattice_mhd_start_tracked(config, handler, handler_context, completed, completed_context,
                                     uri_logger, uri_logger_context, NULL, NULL, NULL, NULL);
}

struct MHD_Daemon *lattice_mhd_start_tracked(const lattice_mhd_config *config,
                                             MHD_AccessHandlerCallback handler, void *handler_context,
                                             MHD_RequestCompletedCallback completed, void *completed_context,
                                             lattice_mhd_uri_logger uri_logger, void *uri_logger_context,
                                             MHD_NotifyConnectionCallback notify, void *notify_context,
                                             MHD_AcceptPolicyCallback accept_policy, void *accept_policy_context) {
    if (config == NULL || handler == NULL || config->thread_pool_size == 0) {
        return NULL;
    }
    struct sockaddr_in address;
    memset(&address, 0, sizeof(address));
    address.sin_family = AF_INET;
    address.sin_port = htons(config->port);
    address.sin_addr.s_addr = config->bind_address_be;

    // MHD_ALLOW_SUSPEND_RESUME implies MHD_USE_ITC (a parked answer resumes its connection through it).
    unsigned int flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ITC;
    // MHD_USE_EPOLL is an enum constant, not a macro, so ask the library at run time.
    if (MHD_is_feature_supported(MHD_FEATURE_EPOLL) == MHD_YES) {
        flags |= MHD_USE_EPOLL;
    }
    // Without a connection callback, MHD_OPTION_NOTIFY_CONNECTION is passed with NULL, which the library
    // treats as none.
    return MHD_start_daemon(
        flags, config->port, accept_policy, accept_policy_context, handler, handler_context,
        MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&address,
        MHD_OPTION_THREAD_POOL_SIZE, config->thread_pool_size,
        MHD_OPTION_CONNECTION_TIMEOUT, config->connection_timeout_s,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, config->per_ip_connection_limit,
        MHD_OPTION_CONNECTION_LIMIT, config->connection_limit,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, config->connection_memory_limit,
        MHD_OPTION_NOTIFY_COMPLETED, completed, completed_context,
        MHD_OPTION_URI_LOG_CALLBACK, uri_logger, uri_logger_context,
        MHD_OPTION_NOTIFY_CONNECTION, notify, notify_context,
        MHD_OPTION_END);
}

int lattice_mhd_connection_fd(struct MHD_Connection *connection) {
    if (connection == NULL) {
        return -1;
    }
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CONNECTION_FD);
    return info == NULL ? -1 : (int)info->connect_fd;
}

uint16_t lattice_mhd_bound_port(struct MHD_Daemon *daemon) {
    if (daemon == NULL) {
        return 0;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(daemon, MHD_DAEMON_INFO_BIND_PORT);
    return info == NULL ? 0 : info->port;
}

int lattice_mhd_client_address(struct MHD_Connection *connection, char *buffer, size_t size) {
    if (connection == NULL || buffer == NULL || size == 0) {
        return 0;
    }
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (info == NULL || info->client_addr == NULL) {
        return 0;
    }
    const struct sockaddr *address = info->client_addr;
    const char *written = NULL;
    if (address->sa_family == AF_INET) {
        written = inet_ntop(AF_INET, &((const struct sockaddr_in *)address)->sin_addr, buffer, (socklen_t)size);
    } else if (address->sa_family == AF_INET6) {
        written = inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)address)->sin6_addr, buffer, (socklen_t)size);
    }
    return written == NULL ? 0 : 1;
}
