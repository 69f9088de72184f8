#if canImport(FoundationEssentials) && !canImport(Darwin)
import FoundationEssentials
#else
import Foundation
#endif
import WispInfrastructure

/// What `list_threads` and `read_thread` show of a thread, made from its binding and history
/// alone, so a live thread and a stored one are shown the same way: its preview, whether it
/// matches a query, the order of a listing and its cursor, and a reading bounded in bytes.
public enum ThreadViews {
    /// A preview's first prompt and last reply, each at most this many bytes of UTF-8.
    public static let previewBytes = 120
    /// Instructions as a listing shows them.
    public static let instructionsBytes = 200
    /// Threads one page holds at most, whatever the caller asks.
    public static let maxPage = 1000

    /// `text` in at most `bytes` bytes of UTF-8, "…" where cut (`String.clipped(toBytes:)`).
    public static func clip(_ text: String, bytes: Int) -> (text: String, cut: Bool) {
        text.clipped(toBytes: bytes)
    }

    /// A listing's entry for a thread with this binding and history; the rest is the caller's.
    public static func info(id: String, instructions: String?, history: [Turn], pending: Int, live: Bool, stored: Bool,
                            usage: UsageBody?, created: Double?, updated: Double?) -> ThreadInfo {
        ThreadInfo(thread_id: id, turns: history.count, pending: pending, live: live, stored: stored, usage: usage,
                   created_at: created, updated_at: updated,
                   first_prompt: history.first.map { clip($0.prompt, bytes: previewBytes).text },
                   last_reply: history.last.map { clip($0.response, bytes: previewBytes).text },
                   instructions: instructions.map { clip($0, bytes: instructionsBytes).text })
    }

    /// Wall-clock Unix seconds, for `created_at` and `updated_at`.
    public static func now() -> Double { Date().timeIntervalSince1970 }

    /// At most the newest `last` turns (all when nil) whose prompts and replies fit in `maxBytes`,
    /// oldest first; the newest one is always given, clipped to fit if it must be.
    public static func read(id: String, instructions: String?, tools: [String], history: [Turn], condensed: Int,
                            last: Int?, maxBytes: Int) -> ReadThreadResult {
        let budget = max(256, maxBytes)
        var items: [TurnItem] = []
        var used = 0
        for turn in history.reversed().prefix(max(0, last ?? history.count)) {
            let size = turn.prompt.utf8.count + turn.response.utf8.count
            if used + size <= budget {
                items.append(TurnItem(prompt: turn.prompt, reply: turn.response, structured: turn.structured))
                used += size
            } else {
                if items.isEmpty {
                    let prompt = clip(turn.prompt, bytes: budget / 4), reply = clip(turn.response,
                                                                                    bytes: budget - budget / 4)
                    // A clipped value is not a value: its turn is shown as text.
                    items.append(TurnItem(prompt: prompt.text, reply: reply.text,
                                          structured: turn.structured && !reply.cut, cut: true))
                }
                break
            }
        }
        return ReadThreadResult(thread_id: id, instructions: instructions, tools: tools, turns: history.count,
                                omitted: history.count - items.count, condensed: condensed, items: items.reversed())
    }
}

/// A listing's order and where a page ends: best match first (with a query), then most recently
/// updated, then by id. A cursor is the last entry's place, written opaquely; the next page is
/// every entry after it, so a listing nothing changes meanwhile gives each thread once.
public struct ListPlace: Sendable, Comparable {
    public let score: Int
    public let updated: Double
    public let id: String

    public init(score: Int, updated: Double, id: String) {
        self.score = score
        self.updated = updated
        self.id = id
    }

    /// `a < b`: `a` comes first.
    public static func < (a: ListPlace, b: ListPlace) -> Bool {
        if a.score != b.score { return a.score > b.score }
        if a.updated != b.updated { return a.updated > b.updated }
        return Array(a.id.utf8).lexicographicallyPrecedes(Array(b.id.utf8))
    }

    public static func == (a: ListPlace, b: ListPlace) -> Bool {
        a.score == b.score && a.updated == b.updated && a.id == b.id
    }

    public var cursor: String {
        "\(String(score, radix: 16))-\(String(updated.bitPattern, radix: 16))-\(id)"
    }

    public init(cursor: String) throws(WispError) {
        let parts = cursor.split(separator: "-", maxSplits: 2, omittingEmptySubsequences: false)
        guard parts.count == 3, let score = Int(parts[0], radix: 16), let bits = UInt64(parts[1], radix: 16),
              ThreadRegistry.isValidID(String(parts[2])) else {
            throw WispError(.invalidArgument,
                            "cursor is not one list_threads returned; omit it to start from the first page")
        }
        self.init(score: score, updated: Double(bitPattern: bits), id: String(parts[2]))
    }
}
