#if canImport(SQLite3)
import SQLite3
#else
import CSQLite
#endif
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// What SQLite said when a call failed: its result code, its message, and the OS's errno where
/// the failure was the file system's (a read-only or full disk shows there, not in the message).
public struct SQLiteError: Error, Sendable, CustomStringConvertible {
    /// The extended result code; `primary` is its low byte.
    public let code: Int32
    public let message: String
    public var primary: Int32 { code & 0xFF }

    /// The database file is not one, or is damaged: nothing in it can be trusted.
    public var isDamaged: Bool { primary == SQLITE_CORRUPT || primary == SQLITE_NOTADB }
    /// Another connection holds the lock past the busy timeout.
    public var isBusy: Bool { primary == SQLITE_BUSY || primary == SQLITE_LOCKED }

    public var description: String { message }

    public init(code: Int32, message: String) {
        self.code = code
        self.message = message
    }

    /// Not SQLite's but the caller's finding that the file is not one it can use (a newer
    /// schema, say): handled as damage.
    public static func unusable(_ message: String) -> SQLiteError { SQLiteError(code: SQLITE_NOTADB, message: message) }
    /// Not SQLite's: the caller's time ran out inside a transaction, which was rolled back.
    public static let pastDeadline = SQLiteError(code: -1, message: "the time limit ran out before the commit")
    public var isPastDeadline: Bool { code == -1 }

    /// The file could not be opened as the one asked for.
    public static func cannotOpen(_ message: String) -> SQLiteError {
        SQLiteError(code: SQLITE_CANTOPEN, message: message)
    }
}

/// A value bound to a statement's parameter.
public enum SQLiteValue: Sendable {
    case int(Int64), double(Double), text(String), null
}

/// One row of a query's result, read by column index inside the query's row callback only
/// (the statement moves on after it).
public struct SQLiteRow {
    fileprivate let statement: OpaquePointer

    public func isNull(_ column: Int32) -> Bool { sqlite3_column_type(statement, column) == SQLITE_NULL }
    public func int(_ column: Int32) -> Int64? { isNull(column) ? nil : sqlite3_column_int64(statement, column) }
    public func double(_ column: Int32) -> Double? { isNull(column) ? nil : sqlite3_column_double(statement, column) }
    public func text(_ column: Int32) -> String? {
        guard let bytes = sqlite3_column_text(statement, column) else { return nil }
        let count = Int(sqlite3_column_bytes(statement, column))
        return String(decoding: UnsafeBufferPointer(start: bytes, count: count), as: UTF8.self)
    }
}

/// One connection to one database file, with its prepared statements kept for reuse. Not
/// Sendable: its owner serialises every use (SQLite's connections are not for two threads at once).
public final class SQLiteDatabase {
    private var handle: OpaquePointer?
    private var statements: [String: OpaquePointer] = [:]

    /// Opens (creating when `create`) the file at `path`; a symlink in its place is refused.
    /// `maxLength`: no string or row read from it may be longer (bounds what a row can make us allocate).
    public init(path: String, create: Bool, maxLength: Int32, busyTimeoutMs: Int32) throws(SQLiteError) {
        var db: OpaquePointer?
        let flags = SQLITE_OPEN_READWRITE | (create ? SQLITE_OPEN_CREATE : 0) | SQLITE_OPEN_NOMUTEX | Self.noFollow
        let rc = sqlite3_open_v2(path, &db, flags, nil)
        guard rc == SQLITE_OK, let db else {
            let message = db.map { String(cString: sqlite3_errmsg($0)) } ?? "cannot open"
            sqlite3_close_v2(db)
            throw SQLiteError(code: rc, message: message)
        }
        handle = db
        sqlite3_extended_result_codes(db, 1)
        sqlite3_limit(db, SQLITE_LIMIT_LENGTH, maxLength)
        sqlite3_busy_timeout(db, busyTimeoutMs)
    }

    deinit { close() }

    /// Closes the connection (its statements first); every later use fails as misuse.
    public func close() {
        for s in statements.values { sqlite3_finalize(s) }
        statements = [:]
        if let handle { sqlite3_close_v2(handle) }
        handle = nil
    }

    /// Copies every committed transaction from the write-ahead log into the database file and
    /// empties the log, so that the file alone holds them; waits at most `waitMs` for readers or
    /// a writer in another process. True when the whole log went in.
    public func checkpoint(waitMs: Int32) -> Bool {
        guard let handle else { return false }
        sqlite3_busy_timeout(handle, waitMs)
        var logged: Int32 = 0, copied: Int32 = 0
        let rc = sqlite3_wal_checkpoint_v2(handle, nil, SQLITE_CHECKPOINT_TRUNCATE, &logged, &copied)
        return rc == SQLITE_OK && logged <= copied
    }

    /// How long a statement waits for another connection's lock before it fails busy.
    public func setBusyTimeout(ms: Int32) {
        if let handle { sqlite3_busy_timeout(handle, max(0, ms)) }
    }

    /// SQLITE_OPEN_NOFOLLOW (3.31); the macOS SDK and Debian 12 both have it.
    private static let noFollow: Int32 = 0x0100_0000

    /// The library's version as it states it, e.g. "3.40.1" (the one loaded, not the one built against).
    public static var libraryVersion: String { String(cString: sqlite3_libversion()) }

    /// The library's compile-time option, e.g. "ENABLE_FTS5".
    public static func hasOption(_ name: String) -> Bool { sqlite3_compileoption_used(name) != 0 }

    /// Keeps the write-ahead log's file when the connection closes, so that closing never
    /// removes a file by its path (the directory's path may name another directory by then).
    public func persistWAL() {
        var on: Int32 = 1
        if let handle { sqlite3_file_control(handle, "main", SQLITE_FCNTL_PERSIST_WAL, &on) }
    }

    /// Runs statements that take no parameters (schema, pragmas, BEGIN/COMMIT).
    public func execute(_ sql: String) throws(SQLiteError) {
        let handle = try open()
        var message: UnsafeMutablePointer<CChar>?
        let rc = sqlite3_exec(handle, sql, nil, nil, &message)
        guard rc == SQLITE_OK else {
            let text = message.map { String(cString: $0) } ?? String(cString: sqlite3_errmsg(handle))
            sqlite3_free(message)
            throw error(rc, text)
        }
    }

    /// Runs one statement with `values` bound, calling `row` for each row it yields.
    public func query(_ sql: String, _ values: [SQLiteValue] = [],
                      row: (SQLiteRow) throws(SQLiteError) -> Void = { _ in }) throws(SQLiteError) {
        let s = try prepared(sql)
        defer { sqlite3_reset(s); sqlite3_clear_bindings(s) }
        for (i, value) in values.enumerated() {
            let at = Int32(i + 1)
            let rc: Int32 = switch value {
            case .int(let v): sqlite3_bind_int64(s, at, v)
            case .double(let v): sqlite3_bind_double(s, at, v)
            case .null: sqlite3_bind_null(s, at)
            case .text(let v): v.utf8CString.withUnsafeBufferPointer {
                sqlite3_bind_text(s, at, $0.baseAddress, Int32(clamping: $0.count - 1), Self.transient)
            }
            }
            guard rc == SQLITE_OK else { throw error(rc) }
        }
        while true {
            let rc = sqlite3_step(s)
            if rc == SQLITE_DONE { return }
            guard rc == SQLITE_ROW else { throw error(rc) }
            try row(SQLiteRow(statement: s))
        }
    }

    /// `body` in one write transaction (taken at once, so two writers never deadlock upgrading a
    /// read); rolled back when it throws.
    public func transaction<T>(_ body: () throws(SQLiteError) -> T) throws(SQLiteError) -> T {
        try execute("BEGIN IMMEDIATE")
        do {
            let value = try body()
            try execute("COMMIT")
            return value
        } catch {
            if let handle, sqlite3_get_autocommit(handle) == 0 { try? execute("ROLLBACK") }
            throw error
        }
    }

    /// `body`'s reads in one snapshot (a deferred transaction, never a write: in WAL mode it waits
    /// for no writer).
    public func reading<T>(_ body: () throws(SQLiteError) -> T) throws(SQLiteError) -> T {
        try execute("BEGIN")
        defer { try? execute("COMMIT") }
        return try body()
    }

    /// Rows changed by the last statement.
    public var changes: Int { handle.map { Int(sqlite3_changes($0)) } ?? 0 }

    private func open() throws(SQLiteError) -> OpaquePointer {
        guard let handle else { throw SQLiteError(code: SQLITE_MISUSE, message: "the database connection is closed") }
        return handle
    }

    private func prepared(_ sql: String) throws(SQLiteError) -> OpaquePointer {
        if let s = statements[sql] { return s }
        let handle = try open()
        var s: OpaquePointer?
        let rc = sqlite3_prepare_v3(handle, sql, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &s, nil)
        guard rc == SQLITE_OK, let s else { throw error(rc) }
        statements[sql] = s
        return s
    }

    private func error(_ rc: Int32, _ text: String? = nil) -> SQLiteError {
        guard let handle else { return SQLiteError(code: rc, message: text ?? "the database connection is closed") }
        var message = text ?? String(cString: sqlite3_errmsg(handle))
        let os = sqlite3_system_errno(handle)
        if os != 0 { message += " (\(String(cString: strerror(os))))" }
        return SQLiteError(code: rc, message: message)
    }

    private static let transient = unsafeBitCast(-1, to: sqlite3_destructor_type.self)
}
