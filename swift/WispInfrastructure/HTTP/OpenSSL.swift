#if os(Linux)
import Glibc

/// The system's OpenSSL 3, loaded at run time with `dlopen` rather than linked: a core linked to
/// nothing but libc and the C++ runtime runs on any Linux, and only https needs the library.
/// The functions wisp calls, looked up once; the one client context every connection shares.
///
/// Pointers to OpenSSL's objects are kept as their addresses (`UInt`): `OpaquePointer` is not
/// Sendable, and OpenSSL documents an `SSL_CTX` as safe to share between threads once set up,
/// which it is before anything else sees it.
struct OpenSSL: Sendable {
    /// What a system without the library is told to install (Debian's and Ubuntu's package; the
    /// library's file name says it on any other).
    static let libraries = (ssl: "libssl.so.3", crypto: "libcrypto.so.3")
    static let installHint = "install OpenSSL 3 (Debian and Ubuntu: apt-get install libssl3; Fedora: openssl-libs)"

    let SSL_new: @convention(c) (OpaquePointer?) -> OpaquePointer?
    let SSL_free: @convention(c) (OpaquePointer?) -> Void
    let SSL_set_fd: @convention(c) (OpaquePointer?, Int32) -> Int32
    let SSL_ctrl: @convention(c) (OpaquePointer?, Int32, Int, UnsafeMutableRawPointer?) -> Int
    let SSL_set1_host: @convention(c) (OpaquePointer?, UnsafePointer<CChar>?) -> Int32
    let SSL_set_hostflags: @convention(c) (OpaquePointer?, UInt32) -> Void
    let SSL_get0_param: @convention(c) (OpaquePointer?) -> OpaquePointer?
    let X509_VERIFY_PARAM_set1_ip: @convention(c) (OpaquePointer?, UnsafePointer<UInt8>?, Int) -> Int32
    let SSL_connect: @convention(c) (OpaquePointer?) -> Int32
    let SSL_read: @convention(c) (OpaquePointer?, UnsafeMutableRawPointer?, Int32) -> Int32
    let SSL_write: @convention(c) (OpaquePointer?, UnsafeRawPointer?, Int32) -> Int32
    let SSL_get_error: @convention(c) (OpaquePointer?, Int32) -> Int32
    let SSL_get_verify_result: @convention(c) (OpaquePointer?) -> Int
    let X509_verify_cert_error_string: @convention(c) (Int) -> UnsafePointer<CChar>?
    let ERR_get_error: @convention(c) () -> UInt
    let ERR_error_string_n: @convention(c) (UInt, UnsafeMutablePointer<CChar>?, Int) -> Void
    let ERR_clear_error: @convention(c) () -> Void
    /// The client context's address.
    let context: UInt

    // The values of OpenSSL 3's macros that wisp uses (ssl.h, tls1.h, x509v3.h): part of its ABI.
    static let SSL_VERIFY_PEER: Int32 = 0x01
    static let SSL_CTRL_SET_TLSEXT_HOSTNAME: Int32 = 55
    static let SSL_CTRL_SET_MIN_PROTO_VERSION: Int32 = 123
    static let TLS1_2_VERSION = 0x0303
    static let SSL_OP_IGNORE_UNEXPECTED_EOF: UInt64 = 1 << 7
    static let X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS: UInt32 = 0x4
    static let SSL_ERROR_SSL: Int32 = 1
    static let SSL_ERROR_WANT_READ: Int32 = 2
    static let SSL_ERROR_WANT_WRITE: Int32 = 3
    static let SSL_ERROR_SYSCALL: Int32 = 5
    static let SSL_ERROR_ZERO_RETURN: Int32 = 6

    /// Loaded once, on first use; the failure says what to install.
    static let shared: Result<OpenSSL, HTTPError> = load(libraries.ssl, libraries.crypto)

    /// `ssl`, `crypto`: file names for `dlopen` (tests name ones that do not exist).
    static func load(_ ssl: String, _ crypto: String) -> Result<OpenSSL, HTTPError> {
        func missing(_ why: String) -> Result<OpenSSL, HTTPError> {
            .failure(HTTPError(.tlsUnavailable, "https needs OpenSSL 3, and \(ssl) could not be loaded (\(why)): "
                               + "\(installHint); plain http works without it"))
        }
        // RTLD_LOCAL: OpenSSL's symbols stay out of the core's namespace.
        guard let sslHandle = dlopen(ssl, RTLD_NOW | RTLD_LOCAL) else { return missing(lastDLError()) }
        guard let cryptoHandle = dlopen(crypto, RTLD_NOW | RTLD_LOCAL) else { return missing(lastDLError()) }
        let find = { (name: String, inCrypto: Bool) in dlsym(inCrypto ? cryptoHandle : sslHandle, name) }
        do {
            let setUp = try ContextFunctions(find)
            if setUp.version() < 0x3000_0000 {
                return missing("it reports version \(String(setUp.version(), radix: 16)), older than 3.0")
            }
            guard let context = setUp.newContext(setUp.clientMethod()) else { return missing("SSL_CTX_new failed") }
            setUp.setVerify(context, SSL_VERIFY_PEER, nil)
            // The system's CA store, or SSL_CERT_FILE / SSL_CERT_DIR when set: OpenSSL reads both here.
            _ = setUp.defaultPaths(context)
            _ = setUp.contextCtrl(context, SSL_CTRL_SET_MIN_PROTO_VERSION, TLS1_2_VERSION, nil)
            // Every answer wisp reads ends by its framing, or with the connection (`Connection: close`):
            // a peer that closes without close_notify has cut nothing the framing would not catch.
            _ = setUp.setOptions(context, SSL_OP_IGNORE_UNEXPECTED_EOF)
            return .success(try OpenSSL(find, context: UInt(bitPattern: context)))
        } catch {
            return missing("it has no \(error.name)")
        }
    }

    struct MissingSymbol: Error { let name: String }

    /// A function of the library, by name; `inCrypto`: libcrypto's rather than libssl's.
    static func function<F>(_ find: (String, Bool) -> UnsafeMutableRawPointer?, _ name: String,
                            inCrypto: Bool = false) throws(MissingSymbol) -> F {
        guard let address = find(name, inCrypto) else { throw MissingSymbol(name: name) }
        return unsafeBitCast(address, to: F.self)
    }

    private init(_ find: (String, Bool) -> UnsafeMutableRawPointer?, context: UInt) throws(MissingSymbol) {
        SSL_new = try Self.function(find, "SSL_new")
        SSL_free = try Self.function(find, "SSL_free")
        SSL_set_fd = try Self.function(find, "SSL_set_fd")
        SSL_ctrl = try Self.function(find, "SSL_ctrl")
        SSL_set1_host = try Self.function(find, "SSL_set1_host")
        SSL_set_hostflags = try Self.function(find, "SSL_set_hostflags")
        SSL_get0_param = try Self.function(find, "SSL_get0_param")
        X509_VERIFY_PARAM_set1_ip = try Self.function(find, "X509_VERIFY_PARAM_set1_ip", inCrypto: true)
        SSL_connect = try Self.function(find, "SSL_connect")
        SSL_read = try Self.function(find, "SSL_read")
        SSL_write = try Self.function(find, "SSL_write")
        SSL_get_error = try Self.function(find, "SSL_get_error")
        SSL_get_verify_result = try Self.function(find, "SSL_get_verify_result")
        X509_verify_cert_error_string = try Self.function(find, "X509_verify_cert_error_string", inCrypto: true)
        ERR_get_error = try Self.function(find, "ERR_get_error", inCrypto: true)
        ERR_error_string_n = try Self.function(find, "ERR_error_string_n", inCrypto: true)
        ERR_clear_error = try Self.function(find, "ERR_clear_error", inCrypto: true)
        self.context = context
    }

    /// What the client context is made with, used once.
    private struct ContextFunctions {
        let version: @convention(c) () -> UInt
        let clientMethod: @convention(c) () -> OpaquePointer?
        let newContext: @convention(c) (OpaquePointer?) -> OpaquePointer?
        let setVerify: @convention(c) (OpaquePointer?, Int32, OpaquePointer?) -> Void
        let defaultPaths: @convention(c) (OpaquePointer?) -> Int32
        let setOptions: @convention(c) (OpaquePointer?, UInt64) -> UInt64
        let contextCtrl: @convention(c) (OpaquePointer?, Int32, Int, UnsafeMutableRawPointer?) -> Int

        init(_ find: (String, Bool) -> UnsafeMutableRawPointer?) throws(MissingSymbol) {
            version = try OpenSSL.function(find, "OpenSSL_version_num", inCrypto: true)
            clientMethod = try OpenSSL.function(find, "TLS_client_method")
            newContext = try OpenSSL.function(find, "SSL_CTX_new")
            setVerify = try OpenSSL.function(find, "SSL_CTX_set_verify")
            defaultPaths = try OpenSSL.function(find, "SSL_CTX_set_default_verify_paths")
            setOptions = try OpenSSL.function(find, "SSL_CTX_set_options")
            contextCtrl = try OpenSSL.function(find, "SSL_CTX_ctrl")
        }
    }

    private static func lastDLError() -> String {
        dlerror().map { String(cString: $0) } ?? "unknown error"
    }
}
#endif
