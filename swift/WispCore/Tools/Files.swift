/// `respond`'s `files`: text files wisp reads itself and gives the model with the prompt, so
/// the caller never has to send their contents. Every path goes through `Roots.open`, the
/// same confined open as the model tools.

/// The paths a call attaches, and the roots they may come from.
public struct FileRequest: Sendable {
    public var paths: [String]
    public var roots: Roots

    public init(paths: [String], roots: Roots) {
        self.paths = paths
        self.roots = roots
    }
}

/// One attached file: the path as the caller gave it, and its text.
public struct AttachedFile: Sendable, Equatable {
    public var path: String
    public var text: String

    public init(path: String, text: String) {
        self.path = path
        self.text = text
    }

    /// How the model sees it: the caller's path in the opening tag, then the text.
    public var block: String {
        "<file path=\"\(path)\">\n\(text)\(TextLines.endsWithLineBreak(text) || text.isEmpty ? "" : "\n")</file>"
    }
}

/// A turn's prompt: the caller's text, and the files attached to it.
public struct ModelPrompt: Sendable, Equatable {
    public var text: String
    public var files: [AttachedFile]

    public init(text: String, files: [AttachedFile] = []) {
        self.text = text
        self.files = files
    }

    /// What a model is given (and what the turn keeps in the history): the prompt, then each
    /// file's block, separated by blank lines.
    public var rendered: String {
        files.isEmpty ? text : ([text] + files.map(\.block)).joined(separator: "\n\n")
    }
}

public enum FileAttachments {
    /// At most this many files in one call.
    public static let maxFiles = 32

    /// Bytes one file may have: half the context at the 4-bytes-per-token estimate.
    public static func perFileBytes(context: Int) -> Int { 2 * context }

    /// Bytes all of a call's files may have together: three quarters of the context, leaving
    /// a quarter for the prompt, the instructions and the reply.
    public static func perCallBytes(context: Int) -> Int { 3 * context }

    /// Reads every file, or refuses the call naming the path and what is wrong with it.
    public static func read(_ request: FileRequest, context: Int) throws(WispError) -> [AttachedFile] {
        guard request.paths.count <= maxFiles else {
            throw WispError(.invalidArgument, "files: \(request.paths.count) paths given; at most \(maxFiles) per call")
        }
        let perFile = perFileBytes(context: context)
        let perCall = perCallBytes(context: context)
        var files: [AttachedFile] = []
        var sizes: [(String, Int)] = []
        for path in request.paths {
            // Stops when the call does (a cancel or its time limit), between files and inside each.
            if Task.isCancelled { throw WispError.callCancelled }
            let opened: Roots.Opened
            do { opened = try request.roots.open(path) } catch {
                throw error.code == .cancelled ? error : WispError(.invalidArgument, "files: \(error.message)")
            }
            let shown = Roots.shown(path)
            guard !opened.isDirectory else {
                throw WispError(.invalidArgument, "files: \(shown) is a directory; attach the files in it one by one")
            }
            let (data, complete) = opened.read(upTo: perFile)
            if Task.isCancelled { throw WispError.callCancelled }
            guard complete else {
                throw WispError(.invalidArgument,
                        "files: \(shown) is over the per-file limit of \(perFile) bytes (for this model's " +
                        "\(context)-token context); attach a smaller file or an excerpt in the prompt")
            }
            guard !data.contains(0), let text = String(validating: data, as: UTF8.self) else {
                throw WispError(.invalidArgument, "files: \(shown) is a binary file; files takes UTF-8 text only")
            }
            files.append(AttachedFile(path: path, text: text))
            sizes.append((path, data.count))
        }
        let total = sizes.reduce(0) { $0 + $1.1 }
        guard total <= perCall else {
            let each = sizes.map { "\(Roots.shown($0.0)) (\($0.1) bytes)" }.joined(separator: ", ")
            throw WispError(.invalidArgument,
                    "files: \(total) bytes in all, over the per-call limit of \(perCall) bytes (for this model's " +
                    "\(context)-token context): \(each)")
        }
        return files
    }
}
