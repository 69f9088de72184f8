import WispInfrastructure

/// Running a model tool and recording what the model saw: one place for every backend, so a
/// tool's refusal reads the same to every model.
enum ToolRun {
    /// The tool's output, or (`failed`) the message of what it threw: a refusal goes back to the
    /// model as text so the turn goes on. Cancellation is rethrown.
    nonisolated(nonsending)
    static func output(_ tool: ModelTool,
                       _ arguments: String) async throws(CancellationError) -> (text: String, failed: Bool) {
        do {
            // Off the pipe loop: a tool reads the disk and may run a search up to its time limit.
            return (try await offPipeLoop(ifDropped: CancellationError()) { try await tool.call(arguments) }, false)
        } catch let error as CancellationError {
            throw error
        } catch let error as WispError {
            return (error.message, true)
        } catch {
            return (String(describing: error), true)
        }
    }

    /// One call as the thread records it. A tool that is not bound is a failed exchange saying
    /// `missing`; a cancelled one is recorded as failed (the caller's loop then stops).
    nonisolated(nonsending)
    static func exchange(_ tool: ModelTool?, name: String, arguments: String,
                         missing: () -> String) async -> ToolExchange {
        guard let tool else { return ToolExchange(name: name, arguments: arguments, output: missing(), failed: true) }
        do {
            let result = try await output(tool, arguments)
            return ToolExchange(name: name, arguments: arguments, output: result.text, failed: result.failed)
        } catch {
            return ToolExchange(name: name, arguments: arguments, output: String(describing: error), failed: true)
        }
    }
}
