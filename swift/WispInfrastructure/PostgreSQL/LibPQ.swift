#if os(Linux)
import Glibc

/// The system's libpq, loaded at run time with `dlopen` rather than linked (as `OpenSSL` is): the
/// released core is linked to nothing but libc and the C++ runtime, and only `--store` needs it.
/// Each function wisp calls is looked up once and declared here with libpq-fe.h's C types; its
/// objects (`PGconn *`, `PGresult *`) are kept as opaque pointers by their owners.
struct LibPQ: Sendable {
    /// The library's file name (its soname since PostgreSQL 8.2) and what a system without it is told.
    static let library = "libpq.so.5"
    static let installHint = "install libpq 5 (Debian and Ubuntu: apt-get install libpq5; Fedora: libpq)"

    let PQconnectdb: @convention(c) (UnsafePointer<CChar>?) -> OpaquePointer?
    let PQstatus: @convention(c) (OpaquePointer?) -> Int32
    let PQerrorMessage: @convention(c) (OpaquePointer?) -> UnsafePointer<CChar>?
    let PQfinish: @convention(c) (OpaquePointer?) -> Void
    let PQexec: @convention(c) (OpaquePointer?, UnsafePointer<CChar>?) -> OpaquePointer?
    let PQsendQuery: @convention(c) (OpaquePointer?, UnsafePointer<CChar>?) -> Int32
    let PQgetResult: @convention(c) (OpaquePointer?) -> OpaquePointer?
    let PQexecParams: @convention(c) (OpaquePointer?, UnsafePointer<CChar>?, Int32, UnsafePointer<UInt32>?,
                                      UnsafePointer<UnsafePointer<CChar>?>?, UnsafePointer<Int32>?,
                                      UnsafePointer<Int32>?, Int32) -> OpaquePointer?
    let PQresultStatus: @convention(c) (OpaquePointer?) -> Int32
    let PQresultErrorMessage: @convention(c) (OpaquePointer?) -> UnsafePointer<CChar>?
    let PQresultErrorField: @convention(c) (OpaquePointer?, Int32) -> UnsafePointer<CChar>?
    let PQntuples: @convention(c) (OpaquePointer?) -> Int32
    let PQnfields: @convention(c) (OpaquePointer?) -> Int32
    let PQgetvalue: @convention(c) (OpaquePointer?, Int32, Int32) -> UnsafePointer<CChar>?
    let PQgetlength: @convention(c) (OpaquePointer?, Int32, Int32) -> Int32
    let PQgetisnull: @convention(c) (OpaquePointer?, Int32, Int32) -> Int32
    let PQclear: @convention(c) (OpaquePointer?) -> Void
    let PQsetNoticeProcessor: @convention(c) (OpaquePointer?, NoticeProcessor?, UnsafeMutableRawPointer?)
        -> NoticeProcessor?
    let PQserverVersion: @convention(c) (OpaquePointer?) -> Int32
    let PQbackendPID: @convention(c) (OpaquePointer?) -> Int32
    let PQlibVersion: @convention(c) () -> Int32

    typealias NoticeProcessor = @convention(c) (UnsafeMutableRawPointer?, UnsafePointer<CChar>?) -> Void

    // libpq-fe.h's enum values wisp reads: part of its ABI since 8.x.
    static let CONNECTION_OK: Int32 = 0
    static let PGRES_COMMAND_OK: Int32 = 1
    static let PGRES_TUPLES_OK: Int32 = 2
    static let PG_DIAG_SQLSTATE = Int32(UInt8(ascii: "C"))

    /// Loaded once, on first use; the failure says what to install.
    static let shared: Result<LibPQ, PostgreSQLError> = load(library)

    /// `name`: the file name for `dlopen` (tests name one that does not exist).
    static func load(_ name: String) -> Result<LibPQ, PostgreSQLError> {
        func missing(_ why: String) -> Result<LibPQ, PostgreSQLError> {
            .failure(PostgreSQLError("--store needs libpq, and \(name) could not be loaded (\(why)): \(installHint); "
                                     + "--state-dir (SQLite) works without it", connectionLost: true))
        }
        // RTLD_LOCAL: libpq's symbols (and its OpenSSL's) stay out of the core's namespace.
        guard let handle = dlopen(name, RTLD_NOW | RTLD_LOCAL) else {
            return missing(dlerror().map { String(cString: $0) } ?? "unknown error")
        }
        do {
            return .success(try LibPQ { dlsym(handle, $0) })
        } catch {
            return missing("it has no \(error.name)")
        }
    }

    struct MissingSymbol: Error { let name: String }

    private static func function<F>(_ find: (String) -> UnsafeMutableRawPointer?,
                                    _ name: String) throws(MissingSymbol) -> F {
        guard let address = find(name) else { throw MissingSymbol(name: name) }
        return unsafeBitCast(address, to: F.self)
    }

    private init(_ find: (String) -> UnsafeMutableRawPointer?) throws(MissingSymbol) {
        PQconnectdb = try Self.function(find, "PQconnectdb")
        PQstatus = try Self.function(find, "PQstatus")
        PQerrorMessage = try Self.function(find, "PQerrorMessage")
        PQfinish = try Self.function(find, "PQfinish")
        PQexec = try Self.function(find, "PQexec")
        PQsendQuery = try Self.function(find, "PQsendQuery")
        PQgetResult = try Self.function(find, "PQgetResult")
        PQexecParams = try Self.function(find, "PQexecParams")
        PQresultStatus = try Self.function(find, "PQresultStatus")
        PQresultErrorMessage = try Self.function(find, "PQresultErrorMessage")
        PQresultErrorField = try Self.function(find, "PQresultErrorField")
        PQntuples = try Self.function(find, "PQntuples")
        PQnfields = try Self.function(find, "PQnfields")
        PQgetvalue = try Self.function(find, "PQgetvalue")
        PQgetlength = try Self.function(find, "PQgetlength")
        PQgetisnull = try Self.function(find, "PQgetisnull")
        PQclear = try Self.function(find, "PQclear")
        PQsetNoticeProcessor = try Self.function(find, "PQsetNoticeProcessor")
        PQserverVersion = try Self.function(find, "PQserverVersion")
        PQbackendPID = try Self.function(find, "PQbackendPID")
        PQlibVersion = try Self.function(find, "PQlibVersion")
    }
}
#endif
