import WispInfrastructure

/// What a call's `Progress` frames carry, decided here alone (stated in the core's facts): a
/// preview, the tail of the answer so far, and its length, at most one frame per interval. A
/// frame that carried the whole partial answer made a streamed answer cost its square: a 1 MB
/// answer in 4-byte deltas was 12 s with a progress token against 0.3 s without.
public final class ProgressFrames: Sendable {
    /// The preview: the last this many Unicode code points of the answer so far.
    public static let previewCodePoints = 400
    /// At most one frame per this many milliseconds: a skipped partial loses nothing, the next
    /// frame (or `flush`) has the newer tail, and the reply has the whole answer.
    public static let intervalMs = 50

    private let id: Int
    private let send: @Sendable ([UInt8]) -> Void
    /// When the last frame went, and the tokens of the newest partial not sent since. Not its
    /// text: a second reference to the answer the backend appends to would make every append
    /// copy it whole.
    private let state = Locked<(sent: Double?, held: Int?)>((nil, nil))

    init(id: Int, send: @escaping @Sendable ([UInt8]) -> Void) {
        self.id = id
        self.send = send
    }

    /// The call's partial replies, as the backend hands them over: each stage at once, text at
    /// most once per interval.
    var handler: PartialHandler {
        { @Sendable [self] p in
            if let waiting = p.waiting { return send(Frame.encode(Stage(id: id, waiting))) }
            let now = monotonicSeconds()
            let due = state.withLock { s -> Bool in
                if let sent = s.sent, now - sent < Double(Self.intervalMs) / 1000 {
                    s.held = p.tokens
                    return false
                }
                s = (now, nil)
                return true
            }
            if due { send(Frame.encode(Self.frame(id: id, p))) }
        }
    }

    /// Before the reply, when the interval held back the newest partial: a frame of the whole
    /// `answer` (the reply's text, which that partial was), so the last frame shows its end.
    func flush(answer: String) {
        if let tokens = state.withLock({ s in defer { s.held = nil }; return s.held }) {
            send(Frame.encode(Self.frame(id: id, PartialReply(text: answer, tokens: tokens))))
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
