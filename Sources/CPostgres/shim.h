// libpq, PostgreSQL's client library (Debian: libpq-dev, headers in /usr/include/postgresql, found through
// pkg-config's libpq).
#include <libpq-fe.h>
