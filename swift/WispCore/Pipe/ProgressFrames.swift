import WispInfrastructure

/// What a call's `Progress` frames carry, decided here alone (stated in the core's facts): a
/// preview, the tail of the answer so far, and its length, at most one frame per interval. A
/// frame that carried the whole partial answer made a streamed answer cost its square: a 1 MB
/// answer in 4-byte deltas was 12 s with a progress token against 0.3 s without.
public enum ProgressFrames {
    /// The preview: the last this many Unicode code points of the answer so far.
    public static let previewCodePoints = 400
    /// At most one frame per this many milliseconds: a skipped partial loses nothing, the next
    /// frame has the newer tail, and the reply has the whole answer.
    public static let intervalMs = 50

    /// A handler that turns a call's partial replies into its frames, handed to `send`.
    static func handler(id: Int, send: @escaping @Sendable ([UInt8]) -> Void) -> PartialHandler {
        let last = Locked<Double?>(nil)
        return { @Sendable p in
            if let waiting = p.waiting { return send(Frame.encode(Stage(id: id, waiting))) }
            let now = monotonicSeconds()
            let due = last.withLock { sent -> Bool in
                if let sent, now - sent < Double(intervalMs) / 1000 { return false }
                sent = now
                return true
            }
            if due { send(Frame.encode(frame(id: id, p))) }
        }
    }

    /// One frame: the preview and the count. Counting is linear in the answer so far, but at
    /// most once per interval, not once per delta. A preview of 400 code points is always far
    /// inside the frame limit.
    static func frame(id: Int, _ p: PartialReply) -> Progress {
        let scalars = p.text.unicodeScalars
        let count = p.text.utf8.withContiguousStorageIfAvailable { bytes in
            bytes.reduce(0) { $0 + ($1 & 0xC0 == 0x80 ? 0 : 1) }  // a code point per lead byte
        } ?? scalars.count
        var text = String.UnicodeScalarView()
        text.append(contentsOf: scalars.suffix(previewCodePoints))
        return Progress(id: id, text: String(text), tokens: p.tokens, chars: count)
    }
}
