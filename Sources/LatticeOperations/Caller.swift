import LatticeCore
import LatticeStore

/// Who runs an operation: the account, the database it addresses, the id of the token it used, and when
/// its work must stop. The HTTP layer makes one from an authenticated request; operations see nothing else
/// of the request but its decoded body.
public struct Caller: Sendable {
    public let user: UserAccount
    public let database: DatabaseKind
    public let environment: String
    /// The id of the bearer token (or browser session) the request was made with.
    public let tokenID: String?
    /// When the work must stop (`ServiceConfiguration.requestDeadlineMilliseconds` from the request's start).
    public let deadline: RequestDeadline?

    public init(user: UserAccount, database: DatabaseKind, environment: String, tokenID: String?,
                deadline: RequestDeadline?) {
        self.user = user
        self.database = database
        self.environment = environment
        self.tokenID = tokenID
        self.deadline = deadline
    }

    /// The database the caller addresses: the public one is everyone's (owner 0).
    public var databaseKey: DatabaseKey {
        DatabaseKey(kind: database, environment: environment, ownerID: database == .public ? 0 : user.id)
    }
}
