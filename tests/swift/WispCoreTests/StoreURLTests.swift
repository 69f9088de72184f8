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
