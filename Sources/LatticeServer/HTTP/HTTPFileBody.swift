import CMicroHTTPD
import Foundation
import Synchronization

/// A body read from storage while it is sent (an asset download), of a known length: an open file, sent from
/// an offset by the kernel (`sendfile`), or a reader called for each block of at most `blockSize` bytes.
/// Either way no more than one block is in memory for the answer.
public final class HTTPFileBody: Sendable {
    public typealias Reader = @Sendable (_ offset: Int64, _ buffer: UnsafeMutableRawBufferPointer) throws -> Int

    enum Source: Sendable {
        case file(descriptor: Int32, offset: Int64)
        case reader(start: Int64, Reader)
    }

    /// Bytes per reader call: one chunk row of the PostgreSQL content store, so each row is fetched once.
    static let blockSize = 1 << 20

    let length: Int64
    /// Nil once libmicrohttpd owns it (it closes a file when it frees the answer).
    private let source: Mutex<Source?>

    /// `length` bytes of the open file `descriptor` from `offset`; the body closes the descriptor.
    public init(descriptor: Int32, offset: Int64, length: Int64) {
        self.length = length
        source = Mutex(.file(descriptor: descriptor, offset: offset))
    }

    /// `length` bytes given by `reader`, called with offsets from `start`.
    public init(start: Int64, length: Int64, reader: @escaping Reader) {
        self.length = length
        source = Mutex(.reader(start: start, reader))
    }

    /// Hands the source to the answer being made (once).
    func take() -> Source? { source.withLock { taken in defer { taken = nil }; return taken } }

    /// A file never handed over is closed here.
    deinit {
        if case .file(let descriptor, _)? = source.withLock({ $0 }) { close(descriptor) }
    }

    /// The libmicrohttpd answer for this body, or nil when it cannot be made (the body is spent either way).
    func makeResponse() -> OpaquePointer? {
        switch take() {
        case .file(let descriptor, let offset)?:
            let response = MHD_create_response_from_fd_at_offset64(UInt64(length), descriptor, UInt64(offset))
            if response == nil { close(descriptor) }
            return response
        case .reader(let start, let reader)?:
            let context = Unmanaged.passRetained(FileReaderContext(start: start, length: length, reader: reader)).toOpaque()
            let response = MHD_create_response_from_callback(UInt64(length), Self.blockSize, fileBodyRead, context, fileBodyFree)
            if response == nil { Unmanaged<FileReaderContext>.fromOpaque(context).release() }
            return response
        case nil:
            return nil
        }
    }
}

/// What a reader answer's callbacks reach.
final class FileReaderContext: Sendable {
    let start: Int64
    let length: Int64
    let reader: HTTPFileBody.Reader

    init(start: Int64, length: Int64, reader: @escaping HTTPFileBody.Reader) {
        self.start = start
        self.length = length
        self.reader = reader
    }
}

/// `MHD_ContentReaderCallback` of a reader body: fills the library's buffer from `start + position`.
func fileBodyRead(_ context: UnsafeMutableRawPointer?, _ position: UInt64, _ buffer: UnsafeMutablePointer<CChar>?,
                  _ capacity: Int) -> Int {
    guard let context, let buffer else { return Int(MHD_CONTENT_READER_END_WITH_ERROR) }
    let body = Unmanaged<FileReaderContext>.fromOpaque(context).takeUnretainedValue()
    let left = body.length - Int64(position)
    guard left > 0 else { return Int(MHD_CONTENT_READER_END_OF_STREAM) }
    let count = Int(min(Int64(capacity), left))
    do {
        let read = try body.reader(body.start + Int64(position), UnsafeMutableRawBufferPointer(start: buffer, count: count))
        // The storage ended before the length promised: the answer cannot be finished honestly.
        return read > 0 ? read : Int(MHD_CONTENT_READER_END_WITH_ERROR)
    } catch {
        return Int(MHD_CONTENT_READER_END_WITH_ERROR)
    }
}

/// `MHD_ContentReaderFreeCallback`: releases the retain `fileBodyRead`'s context holds.
func fileBodyFree(_ context: UnsafeMutableRawPointer?) {
    guard let context else { return }
    Unmanaged<FileReaderContext>.fromOpaque(context).release()
}
