// The build step that gives wisp-core its version: pyproject.toml declares it once, for the Python
// distribution and the core alike, and this reads it at build time (wisp-version-gen) into a Swift
// constant of the wisp-core target. It reruns whenever pyproject.toml changes, so a core and the
// shim built from one checkout always state the same version; the shim refuses any other
// (python/wisp_shim/version.py).
import PackagePlugin

@main
struct WispVersion: BuildToolPlugin {
    func createBuildCommands(context: PluginContext, target: Target) throws -> [Command] {
        let pyproject = context.package.directoryURL.appending(path: "pyproject.toml")
        let output = context.pluginWorkDirectoryURL.appending(path: "WispVersion.swift")
        return [
            .buildCommand(displayName: "wisp-core's version from pyproject.toml",
                          executable: try context.tool(named: "wisp-version-gen").url,
                          arguments: [pyproject.path(percentEncoded: false), output.path(percentEncoded: false)],
                          inputFiles: [pyproject], outputFiles: [output]),
        ]
    }
}
