//! A database of a bench's own on a PostgreSQL cluster, with the name of the client role the
//! bench's `sqlhttpd` logs in as (the server creates the role): made at the start, dropped with
//! the role at the end. Shared by the benches with `#[path]`.
//!
//! Knows the cluster's admin connection only; nothing about what a bench measures.

/// A fresh database `sqlhttp_{bench}_{pid}` and the role name `{bench}_client_{pid}`.
pub(crate) struct ScratchDatabase {
    admin: tokio_postgres::Client,
    /// The database's name.
    pub(crate) name: String,
    /// The client role `sqlhttpd` is to log in as.
    pub(crate) role: String,
    /// The cluster's URL with this database in place of its own.
    pub(crate) url: String,
}

impl ScratchDatabase {
    /// Creates the database on the cluster at `cluster_url` (a role that may create databases
    /// and roles).
    pub(crate) async fn create(cluster_url: &str, bench: &str) -> ScratchDatabase {
        let pid = std::process::id();
        let name = format!("sqlhttp_{bench}_{pid}");
        let (admin, connection) = tokio_postgres::connect(cluster_url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap();
        let (base, _) = cluster_url
            .split('?')
            .next()
            .unwrap()
            .rsplit_once('/')
            .unwrap();
        ScratchDatabase {
            admin,
            url: format!("{base}/{name}"),
            role: format!("{bench}_client_{pid}"),
            name,
        }
    }

    /// Drops the database and the role; a failure is printed, not fatal.
    pub(crate) async fn drop(self) {
        // Two messages: statements sent together run in one transaction, and DROP DATABASE
        // cannot run in one.
        for statement in [
            format!("DROP DATABASE {} WITH (FORCE)", self.name),
            format!("DROP ROLE IF EXISTS {}", self.role),
        ] {
            if let Err(error) = self.admin.batch_execute(&statement).await {
                eprintln!("{statement}: {error}");
            }
        }
    }
}
