#if os(Linux)
import Foundation
import Testing
import WispInfrastructure

/// A real PostgreSQL for the store's tests: its own cluster (`initdb`) in a temporary directory,
/// served on a Unix socket there and a free port, stopped at `stop()`. The binaries are the
/// newest under /usr/lib/postgresql/*/bin (Debian's `postgresql`). As root, where PostgreSQL will
/// not run, the cluster belongs to `nobody` and its commands go through `runuser`.
final class PostgreSQLServer: Sendable {
    static let binDir: String? = {
        let base = "/usr/lib/postgresql"
        let versions = ((try? FileManager.default.contentsOfDirectory(atPath: base)) ?? [])
            .filter { FileManager.default.isExecutableFile(atPath: "\(base)/\($0)/bin/initdb") }
            .sorted { $0.compare($1, options: .numeric) == .orderedAscending }
        return versions.last.map { "\(base)/\($0)/bin" }
    }()
    static let runuser = "/usr/sbin/runuser"
    /// Why the PostgreSQL tests cannot run here, or nil.
    static let absent: String? = {
        guard binDir != nil else { return "PostgreSQL's initdb is not installed (Debian: postgresql)" }
        if let why = PostgreSQLConnection.unavailable { return why }
        if getuid() == 0 && !FileManager.default.isExecutableFile(atPath: runuser) {
            return "running as root, where PostgreSQL will not start, and no \(runuser) to start it as nobody"
        }
        return nil
    }()

    let root: String
    let port: Int

    init() throws {
        root = NSTemporaryDirectory() + "wisp-pg-\(UUID().uuidString.prefix(8))"
        try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true,
                                                attributes: [.posixPermissions: 0o755])
        if getuid() == 0 { try FileManager.default.setAttributes([.ownerAccountName: "nobody"], ofItemAtPath: root) }
        port = Int.random(in: 20000...60000)
        try run("initdb", "-D", root + "/data", "-U", "wisp", "--auth=trust", "-E", "UTF8", "--no-sync")
        try run("pg_ctl", "-D", root + "/data", "-o", "-k \(root) -c listen_addresses= -p \(port) -c fsync=off",
                "-l", root + "/log", "-w", "start")
    }

    var url: String { url(database: "postgres") }

    func url(database: String) -> String { "postgresql://wisp@/\(database)?host=\(root)&port=\(port)" }

    /// One cluster for a whole run's store contract, stopped when the test process exits; nil
    /// where `absent` says why.
    static let shared: PostgreSQLServer? = {
        guard absent == nil, let server = try? PostgreSQLServer() else { return nil }
        atexit { PostgreSQLServer.shared?.stop() }
        return server
    }()

    /// A new, empty database on this cluster, for one test.
    func freshDatabase() throws -> String {
        let name = "w_\(UUID().uuidString.prefix(8).lowercased())"
        let db = try PostgreSQLConnection(url)
        defer { db.close() }
        try db.query("CREATE DATABASE \(name)")
        return url(database: name)
    }

    func stop() {
        try? run("pg_ctl", "-D", root + "/data", "-m", "immediate", "-w", "stop")
        try? FileManager.default.removeItem(atPath: root)
    }

    /// posix_spawn and waitpid rather than Foundation's Process, whose exit watch left
    /// `runuser` a zombie and `waitUntilExit` waiting for ever under the test runner.
    private func run(_ tool: String, _ args: String...) throws {
        let path = Self.binDir! + "/" + tool
        let argv = getuid() == 0 ? [Self.runuser, "-u", "nobody", "--", path] + args : [path] + args
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0)
        let copies = argv.map { strdup($0) }
        defer { for c in copies { free(c) } }
        var pid: pid_t = 0
        let spawned = (copies + [nil]).withUnsafeBufferPointer { v in
            posix_spawn(&pid, argv[0], &actions, nil, UnsafeMutablePointer(mutating: v.baseAddress!), environ)
        }
        guard spawned == 0 else { throw PostgreSQLError("\(tool) could not start (errno \(spawned))") }
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
        guard status == 0 else { throw PostgreSQLError("\(tool) failed (wait status \(status))") }
    }
}
#endif
