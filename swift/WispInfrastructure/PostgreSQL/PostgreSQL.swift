#if os(Linux)
import Glibc

/// What libpq or the server said when a call failed: the message, the server's SQLSTATE where
/// there is one, and whether the connection itself is gone (the server stopped or unreachable, or
/// libpq is not installed).
public struct PostgreSQLError: Error, Sendable, CustomStringConvertible {
    public let message: String
    public let sqlState: String?
    public let connectionLost: Bool
    public var description: String { message }

    public init(_ message: String, sqlState: String? = nil, connectionLost: Bool = false) {
        self.message = message
        self.sqlState = sqlState
        self.connectionLost = connectionLost
    }

    /// The server cancelled the statement at `statement_timeout` (or a lock wait at `lock_timeout`).
    public var isTimeout: Bool { sqlState == "57014" || sqlState == "55P03" }
}

/// One connection to a PostgreSQL server through libpq (`LibPQ`, loaded at run time), parameters
/// sent as text and every result read as text. Not Sendable: its owner serialises every use (a
/// libpq connection is not for two threads at once). libpq reads the connection string as it
/// documents: a `postgresql://` URI or key=value pairs, its `PG*` environment variables and
/// `~/.pgpass` filling what is left out.
public final class PostgreSQLConnection {
    private let pq: LibPQ
    private var handle: OpaquePointer?

    /// Connects; throws libpq's reason when it cannot (libpq's messages name host, port and user,
    /// never the password), or what to install when libpq is absent.
    public init(_ conninfo: String) throws(PostgreSQLError) {
        pq = try LibPQ.shared.get()
        let conn = pq.PQconnectdb(conninfo)
        guard let conn, pq.PQstatus(conn) == LibPQ.CONNECTION_OK else {
            let why = conn.map { Self.text(pq.PQerrorMessage($0)) } ?? "libpq could not allocate a connection"
            pq.PQfinish(conn)
            throw PostgreSQLError(why, connectionLost: true)
        }
        // The server's notices ("already exists, skipping") would go to stderr unlogged.
        _ = pq.PQsetNoticeProcessor(conn, { _, _ in }, nil)
        handle = conn
    }

    /// Why libpq cannot be used by this process (not installed), or nil.
    public static var unavailable: String? {
        if case .failure(let e) = LibPQ.shared { return e.message }
        return nil
    }

    deinit { close() }

    public func close() {
        if let handle { pq.PQfinish(handle) }
        handle = nil
    }

    /// Whether the connection is up as far as libpq knows (a failed call may have found it gone).
    public var isUp: Bool { handle.map { pq.PQstatus($0) == LibPQ.CONNECTION_OK } ?? false }

    /// The server's version as libpq reports it (e.g. 150018 for 15.18); 0 when not connected.
    public var serverVersion: Int { handle.map { Int(pq.PQserverVersion($0)) } ?? 0 }

    /// `serverVersion` as the server writes it: 150018 is "15.18", and before 10 (two numbers for
    /// the major version) 90605 is "9.6.5".
    public static func versionText(_ v: Int) -> String {
        v >= 100_000 ? "\(v / 10000).\(v % 10000)" : "\(v / 10000).\(v / 100 % 100).\(v % 100)"
    }

    /// The backend process serving this connection (its id in `pg_locks`).
    public var backendPID: Int32 { handle.map { pq.PQbackendPID($0) } ?? 0 }

    /// Runs `sql` with `parameters` ($1, $2, …; nil is NULL) and returns its rows, each column as
    /// text (nil for NULL). Several statements without parameters may go in one call.
    @discardableResult
    public func query(_ sql: String, _ parameters: [String?] = []) throws(PostgreSQLError) -> [[String?]] {
        guard let handle else { throw PostgreSQLError("the connection is closed", connectionLost: true) }
        // libpq takes text parameters as C strings: a NUL would cut one short without a word.
        if parameters.contains(where: { $0?.utf8.contains(0) == true }) {
            throw PostgreSQLError("PostgreSQL text cannot hold a NUL character (U+0000), and a value here has one")
        }
        let result = parameters.isEmpty ? pq.PQexec(handle, sql) : exec(handle, sql, parameters)
        defer { pq.PQclear(result) }
        return try rows(of: result, handle)
    }

    /// Runs `sql`, several statements without parameters, in one round trip, and returns each
    /// statement's rows in order (`query` returns only the last's). The statements run as the
    /// server runs a simple query's: in one implicit transaction unless they open their own, each
    /// with a snapshot of its own (READ COMMITTED). Any failure throws; the statements after the
    /// failing one did not run.
    public func batch(_ sql: String) throws(PostgreSQLError) -> [[[String?]]] {
        guard let handle else { throw PostgreSQLError("the connection is closed", connectionLost: true) }
        guard pq.PQsendQuery(handle, sql) == 1 else {
            throw PostgreSQLError(Self.text(pq.PQerrorMessage(handle)), connectionLost: pq.PQstatus(handle) != LibPQ.CONNECTION_OK)
        }
        // Every result is read, up to libpq's nil, even after a failure: the connection is then ready again.
        var out: [[[String?]]] = [], failure: PostgreSQLError?
        while let result = pq.PQgetResult(handle) {
            defer { pq.PQclear(result) }
            do throws(PostgreSQLError) {
                if failure == nil { out.append(try rows(of: result, handle)) }
            } catch {
                failure = error
            }
        }
        // Whether the connection is gone is known once every result is read (a FATAL comes first).
        if let failure {
            throw PostgreSQLError(failure.message, sqlState: failure.sqlState,
                                  connectionLost: failure.connectionLost || pq.PQstatus(handle) != LibPQ.CONNECTION_OK)
        }
        return out
    }

    /// A statement's rows, or what it failed with.
    private func rows(of result: OpaquePointer?, _ handle: OpaquePointer) throws(PostgreSQLError) -> [[String?]] {
        let status = result.map { pq.PQresultStatus($0) } ?? -1
        guard status == LibPQ.PGRES_TUPLES_OK || status == LibPQ.PGRES_COMMAND_OK else {
            let message = result.map { Self.text(pq.PQresultErrorMessage($0)) } ?? ""
            let state = result.flatMap { r in pq.PQresultErrorField(r, LibPQ.PG_DIAG_SQLSTATE).map { String(cString: $0) } }
            throw PostgreSQLError(message.isEmpty ? Self.text(pq.PQerrorMessage(handle)) : message, sqlState: state,
                                  connectionLost: pq.PQstatus(handle) != LibPQ.CONNECTION_OK)
        }
        guard let result, status == LibPQ.PGRES_TUPLES_OK else { return [] }
        return rows(result)
    }

    /// `text` as a string literal for `batch`, whatever `standard_conforming_strings` is (an escape
    /// string: backslashes and quotes doubled). Nil for text holding NUL, which no literal holds.
    public static func literal(_ text: String) -> String? {
        guard !text.utf8.contains(0) else { return nil }
        var quoted = "E'"
        for c in text.unicodeScalars {
            if c == "'" || c == "\\" { quoted.unicodeScalars.append(c) }
            quoted.unicodeScalars.append(c)
        }
        return quoted + "'"
    }

    /// `body` in a transaction `begin` opens (with its settings, and any statements of the
    /// transaction's first round trip: `body` is given their rows, as `batch` returns them),
    /// committed when `body` returns and rolled back when anything in it throws, the opening
    /// statements' own settings included.
    public func transaction<T>(_ begin: String = "BEGIN",
                               _ body: ([[[String?]]]) throws(PostgreSQLError) -> T) throws(PostgreSQLError) -> T {
        do throws(PostgreSQLError) {
            let opened = try batch(begin)
            let value = try body(opened)
            try query("COMMIT")
            return value
        } catch {
            if isUp { _ = try? query("ROLLBACK") }
            throw error
        }
    }

    private func rows(_ result: OpaquePointer) -> [[String?]] {
        let rows = max(0, pq.PQntuples(result)), columns = max(0, pq.PQnfields(result))
        var out: [[String?]] = []
        out.reserveCapacity(Int(rows))
        for r in 0..<rows {
            out.append((0..<columns).map { c -> String? in
                guard pq.PQgetisnull(result, r, c) == 0, let p = pq.PQgetvalue(result, r, c) else { return nil }
                let n = Int(max(0, pq.PQgetlength(result, r, c)))
                return p.withMemoryRebound(to: UInt8.self, capacity: n) { b in
                    String(decoding: UnsafeBufferPointer(start: b, count: n), as: UTF8.self)
                }
            })
        }
        return out
    }

    private func exec(_ handle: OpaquePointer, _ sql: String, _ parameters: [String?]) -> OpaquePointer? {
        let copies: [UnsafeMutablePointer<CChar>?] = parameters.map { $0.flatMap { strdup($0) } }
        defer { for c in copies { free(c) } }
        let values: [UnsafePointer<CChar>?] = copies.map { $0.map { UnsafePointer($0) } }
        return values.withUnsafeBufferPointer { v in
            pq.PQexecParams(handle, sql, Int32(clamping: parameters.count), nil, v.baseAddress, nil, nil, 0)
        }
    }

    private static func text(_ p: UnsafePointer<CChar>?) -> String {
        guard let p else { return "" }
        var s = String(cString: p)
        while s.last == "\n" { s.removeLast() }
        return s
    }
}
#endif
