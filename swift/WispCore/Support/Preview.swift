import WispInfrastructure

extension String {
    /// Bytes of a value from outside that a message or a log line shows, the cut mark included.
    static let previewBytes = 160

    /// The text bounded to `previewBytes` (`clipped(toBytes:)`: in bytes, whatever its clusters).
    var preview: String { bounded(toBytes: Self.previewBytes) }
}
