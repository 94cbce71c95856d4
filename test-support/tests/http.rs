//! The HTTP client against a real socket: status, headers and a chunked body.

use std::io::{Read, Write};
use std::net::TcpListener;

use felixrs_test_support::http;

#[test]
fn get_reads_a_chunked_answer_from_a_socket() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        // Read the whole request: closing with unread input would reset the connection.
        let mut req = Vec::new();
        let mut buf = [0u8; 512];
        while !req.ends_with(b"\r\n\r\n") {
            let n = conn.read(&mut buf).unwrap();
            assert!(n > 0, "request ended early");
            req.extend_from_slice(&buf[..n]);
        }
        conn.write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\n{\"a\r\n3\r\n\":1\r\n1\r\n}\r\n0\r\n\r\n")
            .unwrap();
        String::from_utf8_lossy(&req).into_owned()
    });
    let (code, body) = http::get(addr, "/status?x=1").unwrap();
    assert_eq!((code, body.as_str()), (200, "{\"a\":1}"));
    let req = server.join().unwrap();
    assert!(req.starts_with("GET /status?x=1 HTTP/1.1\r\n"), "{req}");
    assert!(
        http::get(
            format!("127.0.0.1:{}", felixrs_test_support::free_port())
                .parse()
                .unwrap(),
            "/"
        )
        .is_err()
    );
}
