import socket

from keras_replicator.launch._ports import free_ports, port_in_use


def test_port_in_use_sees_a_listening_socket():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert port_in_use(port)
    assert not port_in_use(port)


def test_free_ports_are_free():
    assert not any(port_in_use(port) for port in free_ports(3))
