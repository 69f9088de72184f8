/// `--store URL` (`WISP_STORE`): a PostgreSQL connection URI as libpq reads it. The URL is handed
/// to libpq whole (its `PG*` variables and `~/.pgpass` fill what it leaves out); wisp only checks
/// its scheme and makes the one form of it that may be shown: `shown`, with any password in the
/// user part or a `password=` parameter replaced. Every log line, `--check`, error and reply that
/// names the database uses `shown`, never `url`.
public struct StoreURL: Sendable, Equatable, CustomStringConvertible {
    public static let schemes = ["postgresql://", "postgres://"]
    /// What replaces a password wherever the URL is shown.
    public static let hidden = "***"
    /// The URL as given: for libpq alone.
    public let url: String
    public let shown: String
    public var description: String { shown }

    public init(_ url: String) throws(WispError) {
        guard let scheme = Self.schemes.first(where: { url.lowercased().hasPrefix($0) }) else {
            // Not quoted: an unrecognised value may be a password pasted in the wrong place.
            throw WispError(.invalidArgument, "--store must be a postgresql:// or postgres:// URL "
                            + "(libpq's connection URI), got a value starting otherwise")
        }
        self.url = url
        shown = Self.redact(url, schemeLength: scheme.utf8.count)
    }

    /// `url` with its password (`user:PASSWORD@`, `password=PASSWORD`) replaced by `hidden`.
    static func redact(_ url: String, schemeLength: Int) -> String {
        var bytes = Array(url.utf8)
        let rest = bytes[schemeLength...]
        let authorityEnd = rest.firstIndex { $0 == UInt8(ascii: "/") || $0 == UInt8(ascii: "?") } ?? bytes.endIndex
        if let at = bytes[schemeLength..<authorityEnd].lastIndex(of: UInt8(ascii: "@")),
           let colon = bytes[schemeLength..<at].firstIndex(of: UInt8(ascii: ":")) {
            bytes.replaceSubrange((colon + 1)..<at, with: Array(hidden.utf8))
        }
        guard let q = bytes.firstIndex(of: UInt8(ascii: "?")) else { return String(decoding: bytes, as: UTF8.self) }
        let head = String(decoding: bytes[...q], as: UTF8.self)
        let params = bytes[(q + 1)...].split(separator: UInt8(ascii: "&"), omittingEmptySubsequences: false).map { p in
            let text = String(decoding: p, as: UTF8.self)
            return text.lowercased().hasPrefix("password=") ? "password=" + hidden : text
        }
        return head + params.joined(separator: "&")
    }
}
