"""djl_handlers.config"""
