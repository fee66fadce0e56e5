#ifndef LATTICE_CHTTPSHIMS_H
#define LATTICE_CHTTPSHIMS_H

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
    /// Seconds an idle connection may stay open (the library's default is "forever").
    unsigned int connection_timeout_s;
    /// Simultaneous connections accepted from one IP address.
    unsigned int per_ip_connection_limit;
    /// Total simultaneous connections.
    unsigned int connection_limit;
    /// Bytes of memory one connection may use for headers and buffers.
    size_t connection_memory_limit;
} lattice_mhd_config;

/// Non-variadic wrapper around MHD_start_daemon (which Swift cannot call: it is variadic).
/// Returns NULL when the daemon could not start.
struct MHD_Daemon *lattice_mhd_start(const lattice_mhd_config *config,
                                     MHD_AccessHandlerCallback handler, void *handler_context,
                                     MHD_RequestCompletedCallback completed, void *completed_context);

/// The port the daemon is bound to, or 0 if unknown.
uint16_t lattice_mhd_bound_port(struct MHD_Daemon *daemon);

#endif
