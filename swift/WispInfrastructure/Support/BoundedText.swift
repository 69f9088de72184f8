/// The one way text from outside (a client's ids, names, paths and schemas, a model's reply, a
/// server's words) is shortened before a message, a preview or a log line quotes it. The bound is
/// on UTF-8 bytes, because that is what a frame, a log line and a reader pay for: a bound on
/// Characters is none at all, as one Character may be "e" and a megabyte of combining marks, or a
/// ZWJ chain of any length.
extension String {
    /// Where a cut is marked; counted in the bound.
    public static let cutMark = "…"

    /// This text in at most `bytes` bytes of UTF-8 (the mark included) and whether it was cut.
    /// A cut ends at a Character boundary when one keeps at least half of what fits, else inside
    /// the cluster at a scalar boundary (one cluster may be larger than any bound), so the result
    /// is valid text either way.
    /// Costs O(`bytes`), however long the text or its clusters are.
    public func clipped(toBytes bytes: Int) -> (text: String, cut: Bool) {
        if utf8.count <= bytes { return (self, false) }
        let room = Swift.max(0, bytes - Self.cutMark.utf8.count)
        let scalars = unicodeScalars
        var used = 0
        var end = scalars.startIndex
        while end < scalars.endIndex {
            let n = UTF8.width(scalars[end])
            if used + n > room { break }
            used += n
            end = scalars.index(after: end)
        }
        var head = String(scalars[..<end])
        if end < scalars.endIndex, let last = head.indices.last {
            // The next scalar joins head's last Character when adding it leaves the count alone:
            // the cut is inside that cluster, so it goes back to the cluster's start, unless that
            // would drop most of what fits (one enormous cluster: then the bound wins over it, and
            // a part of it still shows what it was).
            let withNext = head + String(scalars[end])
            if withNext.count == head.count, last > head.startIndex, head[..<last].utf8.count >= room / 2 {
                head = String(head[..<last])
            }
        }
        return (head + Self.cutMark, true)
    }

    /// `clipped(toBytes:)`'s text alone.
    public func bounded(toBytes bytes: Int) -> String { clipped(toBytes: bytes).text }
}
