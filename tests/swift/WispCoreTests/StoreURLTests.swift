import Foundation
import Testing
@testable import WispCore

/// `--store URL`: taken only as a PostgreSQL URL, shown only with its password hidden, never
/// beside `--state-dir`.
@Suite struct StoreURLTests {
    @Test(arguments: [
        ("postgresql://u:secret@h:5432/db", "postgresql://u:***@h:5432/db"),
        ("postgres://u:secret@h/db?sslmode=require", "postgres://u:***@h/db?sslmode=require"),
        ("postgresql://u@h/db?password=secret&sslmode=disable", "postgresql://u@h/db?sslmode=disable&password=***"),
        ("postgresql:///db?host=/tmp/x&PASSWORD=secret", "postgresql:///db?host=/tmp/x&password=***"),
        ("postgresql://u:p@ss:secret@h/db", "postgresql://u:***@h/db"),
        ("POSTGRESQL://h/db", "POSTGRESQL://h/db"),
    ])
    func passwordIsHidden(url: String, shown: String) throws {
        let parsed = try StoreURL(url)
        #expect(parsed.url == url)
        #expect(!parsed.shown.contains("secret"))
        #expect(!parsed.shown.contains("p@ss"))
        if !url.contains("?password") && !url.contains("&PASSWORD") { #expect(parsed.shown == shown) }
    }

    @Test(arguments: ["mysql://u:secret@h/db", "secret", "", "postgresql:/h"])
    func notAPostgreSQLURLIsRefusedWithoutQuotingIt(url: String) {
        #expect { try StoreURL(url) } throws: { error in
            let message = (error as? WispError)?.message ?? ""
            return message.contains("postgresql://") && (url.isEmpty || !message.contains(url))
        }
    }

    @Test func stateDirAndStoreTogetherAreRefusedNamingBoth() {
        for (args, env) in [(["--state-dir", "/s", "--store", "postgresql://u:secret@h/db"], [:]),
                            (["--state-dir", "/s"], ["WISP_STORE": "postgresql://u:secret@h/db"]),
                            ([], ["WISP_STATE_DIR": "/s", "WISP_STORE": "postgresql://u:secret@h/db"])] {
            #expect { try CoreConfig.parse(arguments: args, environment: env) } throws: { error in
                let m = (error as? WispError)?.message ?? ""
                return m.contains("--state-dir (/s)") && m.contains("--store (postgresql://u:***@h/db)")
                    && !m.contains("secret")
            }
        }
    }

    @Test func theFlagWinsOverTheVariable() throws {
        let c = try CoreConfig.parse(arguments: ["--store", "postgresql://a/db"],
                                     environment: ["WISP_STORE": "postgresql://b/db"])
        #expect(c.store?.url == "postgresql://a/db")
        #expect(try CoreConfig.parse(arguments: [], environment: ["WISP_STORE": ""]).store == nil)
    }
}

/// The store the core starts with (`openStore`): a `--store` this build cannot serve refuses the
/// start (asked as a build without PostgreSQL support, which the macOS build is), where an
/// unusable `--state-dir` is served in memory, said.
@Suite struct OpeningTheStore {
    private func config(_ arguments: [String]) throws -> CoreConfig {
        try CoreConfig.parse(arguments: arguments, environment: [:])
    }

    @Test func aStoreThisBuildCannotServeRefusesTheStartNamingItWithoutThePassword() throws {
        let c = try config(["--store", "postgresql://u:pw-9c1@h/db"])
        #expect { _ = try openStore(c, log: Log(level: .error), postgreSQL: false) } throws: { error in
            let e = error as? WispError
            return e?.code == .invalidArgument && e?.message.contains("--store postgresql://u:***@h/db") == true
                && e?.message.contains("Linux only") == true && e?.message.contains("pw-9c1") == false
        }
    }

    @Test func anUnusableStateDirIsServedInMemorySaidAndNoStoreIsNone() throws {
        let file = NSTemporaryDirectory() + "wisp-not-a-dir-\(UInt64.random(in: 0...UInt64.max))"
        #expect(FileManager.default.createFile(atPath: file, contents: Data("x".utf8)))
        defer { try? FileManager.default.removeItem(atPath: file) }
        let opened = try openStore(try config(["--state-dir", file + "/state"]), log: Log(level: .error),
                                   postgreSQL: false)
        #expect(opened.store == nil && opened.error?.contains(file) == true, "\(opened.error ?? "nil")")
        let none = try openStore(try config([]), log: Log(level: .error), postgreSQL: false)
        #expect(none.store == nil && none.error == nil)
    }
}
