"""djl_handlers.formatting"""
