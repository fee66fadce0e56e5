#ifndef LATTICE_CHTTPSHIMS_H
#define LATTICE_CHTTPSHIMS_H

#include <stddef.h>
#include <stdint.h>
#include <microhttpd.h>

/// Limits and sizing for one libmicrohttpd daemon. Every field has a safe meaning at zero only where noted.
typedef struct lattice_mhd_config {
    /// IPv4 address in network byte order to bind to, e.g. htonl(INADDR_LOOPBACK).
    uint32_t bind_address_be;
    /// TCP port; 0 picks a free port (read it back with lattice_mhd_bound_port).
    uint16_t port;
    /// Worker threads in the internal thread pool (>= 1).
    unsigned int thread_pool_size;
    /// Seconds an idle connection may stay open; 0 means forever (the library's default).
    unsigned int connection_timeout_s;
    /// Simultaneous connections accepted from one IP address.
    unsigned int per_ip_connection_limit;
    /// Total simultaneous connections.
    unsigned int connection_limit;
    /// Bytes of memory one connection may use for headers and buffers.
    size_t connection_memory_limit;
} lattice_mhd_config;

/// Called once per request with the request target exactly as sent (path and query, not decoded), before
/// the headers are parsed. What it returns becomes the request's initial `*con_cls`.
typedef void *(*lattice_mhd_uri_logger)(void *context, const char *uri, struct MHD_Connection *connection);

/// Non-variadic wrapper around MHD_start_daemon (which Swift cannot call: it is variadic).
///
/// The daemon runs a thread pool with an internal polling thread (epoll when the library has it) and allows
/// suspending and resuming connections. `uri_logger` and `completed` may be NULL.
/// Returns NULL when the daemon could not start.
struct MHD_Daemon *lattice_mhd_start(const lattice_mhd_config *config,
                                     MHD_AccessHandlerCallback handler, void *handler_context,
                                     MHD_RequestCompletedCallback completed, void *completed_context,
                                     lattice_mhd_uri_logger uri_logger, void *uri_logger_context);

/// `lattice_mhd_start` plus MHD_OPTION_NOTIFY_CONNECTION: `notify` (may be NULL) runs when a connection
/// is accepted (MHD_CONNECTION_NOTIFY_STARTED) and when it is cleaned up (MHD_CONNECTION_NOTIFY_CLOSED,
/// which libmicrohttpd calls before it closes the socket, so the descriptor stays this connection's until
/// the callback returns). `per_ip_connection_limit` 0 means no limit from the library. `accept_policy`
/// (may be NULL) decides on each accepted connection; MHD_NO closes it at once. (A server stops taking
/// connections through it rather than MHD_quiesce_daemon, which in 0.9.75 races its own epoll workers and
/// can abort the process: "Failed to remove listen FD from epoll set".)
struct MHD_Daemon *lattice_mhd_start_tracked(const lattice_mhd_config *config,
                                             MHD_AccessHandlerCallback handler, void *handler_context,
                                             MHD_RequestCompletedCallback completed, void *completed_context,
                                             lattice_mhd_uri_logger uri_logger, void *uri_logger_context,
                                             MHD_NotifyConnectionCallback notify, void *notify_context,
                                             MHD_AcceptPolicyCallback accept_policy, void *accept_policy_context);

/// The connection's socket descriptor, or -1.
int lattice_mhd_connection_fd(struct MHD_Connection *connection);

/// The port the daemon is bound to, or 0 if unknown.
uint16_t lattice_mhd_bound_port(struct MHD_Daemon *daemon);

/// Writes the client's address as text (dotted IPv4, or IPv6) into `buffer`, NUL-terminated.
/// Returns 1 on success and 0 when the address is unknown or does not fit.
int lattice_mhd_client_address(struct MHD_Connection *connection, char *buffer, size_t size);

#endif
