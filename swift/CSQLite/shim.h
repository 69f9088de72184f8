// The system's SQLite on Linux (Debian: libsqlite3-dev); macOS builds import the SDK's SQLite3 module instead.
#include <sqlite3.h>
